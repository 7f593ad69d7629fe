"""evaluate.py --ray on a real local Ray cluster: a head that only coordinates (no CPUs to schedule on) and two
worker nodes of one CPU each, started as users start them (`ray start --head`, `ray start --address`), each with
its own folder, all on this machine; the real CLI on C++ candidates, real builds and runs.

The nodes are stopped by ending the `ray start --block` processes this module started (never `ray stop`, which
would stop every Ray node of the machine)."""
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

ray = pytest.importorskip("ray")

from kevin import evaluator as ev  # noqa: E402
from kevin import ray_pool  # noqa: E402
from kevin.build_cache import extension_key  # noqa: E402
from kevin.eval_records import library_records  # noqa: E402
from test_evaluate import start_for_ctrl_c  # noqa: E402

# one cluster for the module, on one xdist worker: two clusters on two cores starve each other's actors
pytestmark = pytest.mark.xdist_group("ray")

ROOT = Path(__file__).resolve().parents[1]
TASKS = str(ROOT / "tests" / "tasks")
FAST = ["--tasks", TASKS, "--timing-budget-s", "0.5", "--run-timeout-s", "60", "--no-progress"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Cluster:
    """The `ray start --block` processes of one local cluster; each node in its own session (so that killing one
    kills what it started) and its own temp folder."""

    def __init__(self, folder: Path):
        self.folder, self.port = folder, free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.head = self.node("head", "--head", f"--port={self.port}", "--num-cpus=0", "--include-dashboard=false")
        self.workers = [self.node(f"worker{i}", f"--address={self.address}", "--num-cpus=1") for i in range(2)]
        deadline = time.monotonic() + 120
        while self.alive_nodes() < 3:
            if time.monotonic() > deadline or any(n.poll() is not None for n in [self.head, *self.workers]):
                self.stop()
                raise RuntimeError(f"the local Ray cluster did not come up (logs: {folder})")
            time.sleep(1)

    def node(self, name: str, *args) -> subprocess.Popen:
        return subprocess.Popen(["ray", "start", "--block", "--disable-usage-stats", "--object-store-memory=100000000",
                                 f"--temp-dir={self.folder / name}", *args],
                                stdout=open(self.folder / f"{name}.log", "w"), stderr=subprocess.STDOUT,
                                start_new_session=True)

    def alive_nodes(self) -> int:
        done = subprocess.run(["ray", "status", f"--address={self.address}"], capture_output=True, text=True)
        return len(re.findall(r"^ 1 node_", done.stdout, re.M))

    def kill(self, name: str) -> None:
        """A node's death: every process started with its folder (its raylet, object store, workers), SIGKILL."""
        for proc in Path("/proc").iterdir():
            try:
                if str(self.folder / name).encode() in (proc / "cmdline").read_bytes():
                    os.kill(int(proc.name), signal.SIGKILL)
            except (OSError, ValueError):
                pass

    def stop(self) -> None:
        for node in [*self.workers, self.head]:
            if node.poll() is None:
                node.terminate()
        for node in [*self.workers, self.head]:
            try:
                node.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(node.pid, signal.SIGKILL)


@pytest.fixture(scope="module", autouse=True)
def without_token_authentication():
    """The local cluster's nodes, and the evaluators that join it, with Ray's token authentication off: a token a
    user's own Ray left in ~/.ray made the head ask for it and the workers, not given it, fail to join."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("RAY_AUTH_MODE", "disabled")
        yield


@pytest.fixture(scope="module")
def cluster():
    """In a short folder of /tmp: Ray's sockets live under its temp dir, and a Unix socket's path has at most 107
    bytes, which pytest's own temp folders (under xdist) exceed."""
    folder = Path(tempfile.mkdtemp(prefix="ray", dir="/tmp"))
    cluster = Cluster(folder)
    yield cluster
    cluster.stop()
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="module")
def build_dir(tmp_path_factory):
    """One build cache for the module's runs, on the cluster and off it: an extension is built once."""
    return str(tmp_path_factory.mktemp("builds"))


def picked(*names: str) -> list[dict]:
    """The hand-written C++ candidates (solutions/cpu, tests/adversarial/cpu) of these names, in this order."""
    library = {r["solution"]: r for folder in ("solutions/cpu", "tests/adversarial/cpu")
               for r in library_records(ROOT / folder)}
    return [library[f"level1/{name}"] for name in names]


# two honest kernels, three faults and a candidate that tries to open a socket (the sandbox kills it)
MIXED = picked("7_ReLU.correct_loop", "7_ReLU.incorrect_leaky", "7_ReLU.compile_error_semicolon",
               "7_ReLU.rejected_torch_fallback", "7_ReLU.rejected_sandbox", "9_Swish.correct_fused")


def copies(record: dict, count: int) -> list[dict]:
    """`count` distinct candidates of one extension (a comment apart): each judged, one build."""
    return [{**record, "code": record["code"] + f"\n# copy {n}\n", "copy": n} for n in range(count)]


def write(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def cli(*args) -> list[str]:
    return [sys.executable, str(ROOT / "evaluate.py"), *args]


def verdicts(lines: list[str]) -> list[tuple]:
    """(solution, copy, status, the rule a rejection names) per output line."""
    rows = [json.loads(line) for line in lines]
    return [(r.get("solution"), r.get("copy"), r["eval"]["status"], re.findall(r"\[[\w-]+\]", r["eval"]["feedback"]))
            for r in rows]


def wait_for_lines(path: Path, count: int, proc: subprocess.Popen, timeout_s: float = 300) -> None:
    deadline = time.monotonic() + timeout_s
    while not (path.exists() and len(path.read_text().splitlines()) >= count):
        assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read() if proc.stderr else ""
        time.sleep(0.2)


@pytest.mark.slow
def test_on_the_cluster_verdicts_and_order_are_the_single_machine_evaluators(cluster, build_dir, tmp_path):
    """The same candidates through the cluster's two workers and through today's evaluator on this machine: the
    same status, and rule, for each, in input order; the sandbox holds on the workers (the socket is refused)."""
    source = write(tmp_path / "in.jsonl", MIXED)
    runs = [subprocess.run(cli(str(source), *FAST, "--build-dir", build_dir, *extra), capture_output=True, text=True,
                           cwd=ROOT, timeout=600) for extra in (["--ray", cluster.address], [])]
    for run in runs:
        assert run.returncode == 0, run.stderr
    on_cluster, alone = (verdicts(run.stdout.splitlines()) for run in runs)
    assert on_cluster == alone
    assert [status for _, _, status, _ in on_cluster] == ["correct", "incorrect", "compile_error", "rejected",
                                                          "rejected", "correct"]
    assert on_cluster[4][3] == ["[sandbox]"]


@pytest.mark.slow
def test_a_run_interrupted_on_the_cluster_resumes_from_what_it_wrote(cluster, build_dir, tmp_path):
    """Ctrl-C once the first result is written: exit 130 with only true results in the file; the re-run writes
    the rest, each line once, in input order. The first candidate is quick, the others slow (slow_relu), and each
    pool holds one candidate at a time (no spare children): the first is written while the second still runs on
    the other worker and the rest wait, so the interrupt finds work left however fast the machine."""
    records = [{**MIXED[0], "copy": 0}] + copies(slow_relu(), 6)[1:]
    source, out = write(tmp_path / "in.jsonl", records), tmp_path / "out.jsonl"
    args = cli(str(source), "-o", str(out), "--ray", cluster.address, *FAST, "--build-dir", build_dir,
               "--spare-children", "0")
    first = start_for_ctrl_c(args)  # Ctrl-C heard even where this suite runs with it ignored (a background job)
    wait_for_lines(out, 1, first)
    os.killpg(first.pid, signal.SIGINT)
    _, stderr = first.communicate(timeout=120)
    assert first.returncode == 130, stderr
    written = int(re.search(r"interrupted: (\d+) of 6 written", stderr).group(1))
    assert 1 <= written <= 6 and len(out.read_text().splitlines()) == written
    again = subprocess.run(args, capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert again.returncode == 0 and f"resuming: {written} of 6" in again.stderr, again.stderr
    assert verdicts(out.read_text().splitlines()) == [(MIXED[0]["solution"], n, "correct", []) for n in range(6)]


def test_an_unreachable_cluster_is_one_line():
    done = subprocess.run(cli("-", "--ray", f"127.0.0.1:{free_port()}", "--tasks", TASKS), input="", text=True,
                          capture_output=True, cwd=ROOT, timeout=120)
    assert done.returncode != 0 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.strip().splitlines()[-1].startswith("error: --ray 127.0.0.1:")


def test_gpus_with_ray_is_refused_in_one_line():
    with pytest.raises(ValueError, match="with --ray every GPU of the cluster evaluates"):
        ev.EvalConfig(ray="auto", gpus=[0])


@pytest.mark.slow
def test_a_build_on_one_node_is_shipped_to_another_not_repeated(cluster, tmp_path):
    """Two pools on the two workers, each with a build cache of its own: the extension the first built reaches the
    second through the object store, checked, and is loaded there without a compile (no build files in its
    folder). A library whose bytes are not those its digest names is refused: built here instead."""
    ray.init(address=cluster.address, namespace="test_ray", log_to_driver=False)
    try:
        libraries = ray_pool.Libraries.options(num_cpus=0).remote()
        workers = [n["NodeID"] for n in ray.nodes() if n["Alive"] and n["Resources"].get("CPU")]
        assert len(workers) == 2
        pools = []
        for node, folder in zip(workers, ("a", "b")):
            cfg = ev.EvalConfig(device="cpu", tasks=TASKS, build_dir=str(tmp_path / folder), progress=False,
                                compile_workers=1, timing_budget_s=0.5)
            strategy = ray_pool.NodeAffinitySchedulingStrategy(node, soft=False)
            pools.append(ray_pool.Pool.options(num_cpus=0, max_concurrency=8, scheduling_strategy=strategy).remote(
                cfg, [TASKS], libraries))
        for pool in pools:
            assert ray.get(pool.judge.remote(MIXED[0]), timeout=300)["status"] == "correct"
        [built] = [p.parent for p in (tmp_path / "a").glob("*/*.so")]
        [shipped] = [p.parent for p in (tmp_path / "b").glob("*/*.so")]
        assert built.name == shipped.name  # one digest
        assert (built / "build.ninja").exists() and not (shipped / "build.ninja").exists()
        assert sorted(p.name for p in shipped.iterdir()) == sorted(p.name for p in built.glob("*.so*"))

        shipping = ray_pool.ShippedBuilds(libraries)
        digest = extension_key({"name": "forged", "cpp_sources": "// never built"}, "")[0]
        honest_sha = ray_pool.hashlib.sha256(b"what the build made").hexdigest()
        ray.get(libraries.publish.remote(digest + shipping.abi, ([ray.put(b"what a candidate wrote")], honest_sha)))
        target = tmp_path / "c" / digest / "forged.so"
        assert not shipping.fetch(digest, target) and not target.exists()
    finally:
        ray.shutdown()


@pytest.mark.slow
def test_a_worker_killed_mid_run_costs_only_its_candidates_which_run_again_on_the_other(cluster, build_dir, tmp_path):
    """Once the first result is written, one worker node dies (raylet, workers and children, SIGKILL): every
    candidate still gets its true verdict, each line once, in order; the run says what it ran again. (Last in
    the module: the cluster has one worker from here on.) The first candidate is quick and built first; the others
    sleep a little in every call, so that both pools still hold some when the node dies."""
    records = [{**MIXED[0], "copy": 0}] + copies(slow_relu(), 8)[1:]  # the first written while the others run
    source, out = write(tmp_path / "in.jsonl", records), tmp_path / "out.jsonl"
    run = subprocess.Popen(cli(str(source), "-o", str(out), "--ray", cluster.address, *FAST, "--build-dir",
                               build_dir), cwd=ROOT, stderr=subprocess.PIPE, text=True)
    wait_for_lines(out, 1, run)
    cluster.kill("worker1")
    _, stderr = run.communicate(timeout=600)
    assert run.returncode == 0, stderr
    assert re.search(r"the evaluator on \S+ is gone \(its node died\?\): its [1-9]\d* candidate", stderr), stderr
    assert verdicts(out.read_text().splitlines()) == [(MIXED[0]["solution"], n, "correct", []) for n in range(8)]


def slow_relu() -> dict:
    """The honest C++ ReLU taking 0.2 s a call (asleep, holding no core): a few seconds to judge, so that the pools
    still hold candidates when a node dies."""
    record = MIXED[0]
    code = record["code"].replace("return relu_ext.relu(x.contiguous())",
                                  "import time; time.sleep(0.2); return relu_ext.relu(x.contiguous())")
    assert code != record["code"]
    return {**record, "code": code}
