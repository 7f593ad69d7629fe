"""The sandbox around the children that run candidate code, shown through the real CLI.

Each attack in tests/adversarial/sandbox/ is a correct ReLU that also tries one thing from native code, when
its extension loads and on its first call: change the evaluator's own files, forge a result line in its
stdout or its -o file, spoil or delete the build cache that other candidates load from, reach the network.
Unboxed, every attack succeeds and the candidate is judged correct; with the sandbox, each attempt is
refused, and the candidate throws (a `runtime_error` naming the refusal) or is killed by seccomp (`rejected`
with a `[sandbox]` rule). The attacks are templates: the test fills in the paths and the port, as an
attacker who knows the setup would.

Every run is against a copy of the project's Python files in a temporary folder, with a build cache and
output file outside that copy, so that a defence that fails cannot damage the checkout. Each input has an
honest candidate first, then the attacker, then an honest copy under another extension name (the same
sources, so it loads the cached build). Two runs share one build cache: the one that deletes the cache goes
first and alone (a deleted cache would hide an overwritten one), then the five whose traces stay apart (a
project file, stdout, the output file, the port, the cached shared objects) share the next, which finds
the honest build left by the first: the overwrite has a build to go after, and the honest candidates load
it in a second run over the cache. A last run of the honest ones alone loads the cache once more."""
import hashlib
import json
import re
import shutil
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from kevin.eval_children import sandbox_mechanisms
from kevin import sandbox

ROOT = Path(__file__).resolve().parents[1]
ATTACKS = ROOT / "tests" / "adversarial" / "sandbox"
TASK = "level1/7_ReLU"
# In the order they run over one build cache; the five whose traces stay apart share the second run.
RUNS = {"delete": ("delete_build_cache",),
        "separable": ("append_evaluate_py", "forge_stdout_line", "forge_output_line", "connect_tcp",
                      "overwrite_cached_so")}
ELF = b"\x7fELF"
HONEST = {"cpu": ROOT / "solutions" / "cpu" / "level1" / "7_ReLU.correct_loop.py",
          "cuda": ROOT / "solutions" / "cuda" / "level1" / "7_ReLU.correct_vec4.py"}
# How a refused attempt reads in a candidate's own exception: its strerror, or no evaluator in sight.
REFUSED = re.compile(r"Permission denied|Operation not permitted|Read-only file system|No such file or directory|"
                     r"Network is unreachable|Connection refused|Address family not supported|"
                     r"no ancestor process runs evaluate\.py")

pytestmark = pytest.mark.slow


# ------------------------------------------------------------------------------------------------ helpers

def honest(device: str, name: str | None = None) -> str:
    """The hand-written correct ReLU; with `name`, a copy whose extension is called that (one build for both)."""
    code = HONEST[device].read_text()
    return re.sub(r'name="\w+"', f'name="{name}"', code, count=1) if name else code


def attack(device: str, what: str, **fills: str) -> str:
    """The attack template `what`, its @PLACEHOLDERS@ filled in (every one: an unfilled one would be no attack)."""
    code = (ATTACKS / device / f"7_ReLU.{what}.py").read_text()
    for key, value in fills.items():
        code = code.replace(f"@{key.upper()}@", value)
    assert not re.search(r"@[A-Z_]+@", code), f"unfilled placeholder in {what}"
    return code


def copy_project(folder: Path) -> Path:
    """The stage scripts, the package and the CPU-sized tasks, copied: the runs happen there."""
    project = folder / "project"
    project.mkdir(parents=True)
    for f in ROOT.glob("*.py"):
        shutil.copy2(f, project / f.name)
    shutil.copytree(ROOT / "kevin", project / "kevin", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(ROOT / "tests" / "tasks", project / "tests" / "tasks")
    return project


def fingerprint(folder: Path) -> dict[str, str]:
    """sha256 of every file under `folder` (bytecode caches aside): a change, a new file or a missing one shows."""
    return {str(f.relative_to(folder)): hashlib.sha256(f.read_bytes()).hexdigest()
            for f in sorted(folder.rglob("*")) if f.is_file() and "__pycache__" not in f.parts}


class Listener:
    """A TCP server on 127.0.0.1 that counts the connections made to it, until stopped (accept never waits
    longer than half a second, so stopping is prompt)."""

    def __init__(self):
        self.server = socket.create_server(("127.0.0.1", 0))
        self.server.settimeout(0.5)
        self.port = self.server.getsockname()[1]
        self.connections: list[bytes] = []
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self):
        while not self.stopping.is_set():
            try:
                conn, _ = self.server.accept()
            except socket.timeout:
                continue
            with conn:
                conn.settimeout(2)
                try:
                    self.connections.append(conn.recv(4096))
                except OSError:
                    self.connections.append(b"")

    def stop(self) -> list[bytes]:
        self.stopping.set()
        self.thread.join()
        self.server.close()
        return self.connections


def run_cli(project: Path, records: list[dict], out: Path, build_dir: Path, device: str, *extra: str,
            workers: int = 1):
    """`python evaluate.py IN -o OUT` in the copied project, as a pipeline would run it, building `workers`
    candidates at once (one: in input order); the records are also returned, as read back from OUT."""
    source = out.with_suffix(".in.jsonl")
    source.write_text("".join(json.dumps(r) + "\n" for r in records))
    done = subprocess.run(
        [sys.executable, "evaluate.py", str(source), "-o", str(out), "--device", device, "--tasks", "tests/tasks",
         "--build-dir", str(build_dir), "--run-timeout-s", "60", "--timing-budget-s", "0",
         "--compile-workers", str(workers), "--no-progress", *extra],
        cwd=project, capture_output=True, text=True, timeout=900)
    rows = [json.loads(line) for line in out.read_text().splitlines() if line.strip()] if out.exists() else []
    return done, rows


def honest_ones(rows: list[dict]) -> list[dict]:
    return [r for r in rows if str(r.get("id")).startswith("honest")]


def attack_run(folder: Path, device: str, attacks: tuple[str, ...], build_dir: Path, again: bool,
               workers: int = 1) -> dict:
    """One CLI run over an honest candidate, then each attacker followed by an honest copy; with `again`, a
    second run of the honest ones alone over the same build cache. What each saw, the project before and
    after, and the first bytes of each shared object in the cache at the end."""
    project = copy_project(folder)
    out = (folder / "out.jsonl").resolve()
    listener = Listener()
    fills = dict(evaluate_py=str(project / "evaluate.py"), output=str(out), build_root=str(build_dir),
                 port=str(listener.port))
    records = [{"task": TASK, "code": honest(device), "id": "honest-0"}]
    for n, what in enumerate(attacks, 1):
        records.append({"task": TASK, "code": attack(device, what, **fills), "id": what})
        records.append({"task": TASK, "code": honest(device, name=f"relu_honest_copy_{n}"), "id": f"honest-{n}"})
    before = fingerprint(project)
    try:
        done, rows = run_cli(project, records, out, build_dir, device, workers=workers)
    finally:
        connections = listener.stop()
    again_records = honest_ones(records)
    again, again_rows = (run_cli(project, again_records, folder / "again.jsonl", build_dir, device) if again
                         else (None, []))
    return dict(records=records, done=done, rows=rows, connections=connections, before=before,
                after=fingerprint(project), again_records=again_records, again=again, again_rows=again_rows,
                build_dir=build_dir, shared_objects={f: f.read_bytes()[:4] for f in build_dir.rglob("*.so")})


def attack_runs(folder: Path, device: str, workers: int, build_dir: Path) -> dict[str, dict]:
    """RUNS, one after the other over one build cache, the second with `workers` builds at once; the second
    run's honest candidates are the first run's second run over the cache."""
    build_dir = build_dir.resolve()
    delete = attack_run(folder / "delete", device, RUNS["delete"], build_dir, again=False)
    separable = attack_run(folder / "separable", device, RUNS["separable"], build_dir, again=True, workers=workers)
    delete.update(again_records=honest_ones(separable["records"]), again_rows=honest_ones(separable["rows"]))
    return {"delete": delete, "separable": separable}


def statuses(rows: list[dict]) -> dict[str, str]:
    return {r.get("id"): r["eval"]["status"] for r in rows}


def assert_stopped(result: dict) -> None:
    """Not correct: killed by seccomp (`rejected`, a [sandbox] rule) or failed with the refusal it met."""
    status, feedback = result["status"], result["feedback"]
    assert status in ("runtime_error", "rejected") and status != "correct", (status, feedback)
    if status == "rejected":
        assert "[sandbox]" in feedback, feedback
    else:
        assert "blocked:" in feedback and REFUSED.search(feedback), feedback


# ------------------------------------------------------------------------------------------- CPU, unboxed?

@pytest.fixture(scope="module")
def cpu_runs(tmp_path_factory, new_build_dir):
    folder = tmp_path_factory.mktemp("cpu")
    return attack_runs(folder, "cpu", workers=1, build_dir=new_build_dir(folder / "builds"))


@pytest.fixture(scope="module")
def separable(cpu_runs):
    return cpu_runs["separable"]


@pytest.fixture(scope="module")
def delete(cpu_runs):
    return cpu_runs["delete"]


def test_a_candidate_cannot_change_the_evaluators_files(separable):
    """evaluate.py and every other project file come out of the run byte for byte as they went in, whether
    the attacker opens the path it knows or goes through /proc/<evaluator>/cwd."""
    assert separable["after"] == separable["before"]


def test_a_candidate_cannot_write_into_the_evaluators_stdout(separable):
    """With -o the evaluator writes nothing to stdout: any line there (a forged result through
    /proc/<evaluator>/fd/1) came from a candidate."""
    assert separable["done"].returncode == 0, separable["done"].stderr[-3000:]
    assert "forged" not in separable["done"].stdout
    assert separable["done"].stdout == ""


def test_a_candidate_cannot_add_a_line_to_the_output_file(separable):
    """The -o file holds exactly one line per input, in input order: a forged line would pass for a result
    (and shift every line after it, for a reader that zips them with the inputs)."""
    got = [(r.get("id"), r["task"], r["code"]) for r in separable["rows"]]
    assert got == [(r["id"], r["task"], r["code"]) for r in separable["records"]]
    assert not any(r["eval"].get("forged") for r in separable["rows"])


def test_a_candidate_cannot_connect_to_a_local_port(separable):
    """Nothing reaches a server listening on 127.0.0.1 during the run: the children have no network."""
    assert separable["connections"] == []


def test_a_candidate_cannot_overwrite_another_candidates_build(separable):
    """Every shared object left in the cache is still an ELF file, and a second run, in which the honest
    candidates load their cached build, still finds them correct."""
    assert [str(f) for f, magic in separable["shared_objects"].items() if magic != ELF] == []
    assert statuses(separable["again_rows"]) == {r["id"]: "correct" for r in separable["again_records"]}, \
        [r["eval"]["feedback"][:300] for r in separable["again_rows"]]


def test_a_candidate_cannot_delete_the_build_cache(delete):
    """The honest build made before the attacker, and the evaluator's working folder with the candidates'
    sources, survive it: every input gets its line, the honest copy after the attacker (which loads that
    build) is correct, and the build is still in the cache when the run is over."""
    assert [r.get("id") for r in delete["rows"]] == [r["id"] for r in delete["records"]], \
        delete["done"].stderr[-3000:]
    assert statuses(delete["rows"])["honest-1"] == "correct", [r["eval"]["feedback"][:300] for r in delete["rows"]]
    honest_builds = [f for f in delete["shared_objects"] if f.parent.parent == delete["build_dir"]
                     and "attempt()" not in (f.parent / "main.cpp").read_text()]
    assert honest_builds


@pytest.mark.parametrize("what", [w for attacks in RUNS.values() for w in attacks])
def test_each_attacker_is_stopped_and_its_honest_neighbours_are_correct(what, cpu_runs):
    """The attacker's status says it was stopped (not `correct`, with the refusal in its feedback); the honest
    candidates just before and after it in the same run are still correct."""
    run = cpu_runs[next(name for name, attacks in RUNS.items() if what in attacks)]
    by_id = {r.get("id"): r["eval"] for r in run["rows"]}
    assert what in by_id, f"no result for {what}: {run['done'].stderr[-3000:]}"
    assert_stopped(by_id[what])
    at = [r["id"] for r in run["records"]].index(what)
    neighbours = (run["records"][at - 1]["id"], run["records"][at + 1]["id"])
    assert {n: by_id.get(n, {}).get("status") for n in neighbours} == {n: "correct" for n in neighbours}


# ------------------------------------------------------------------------------- the control: unboxed

def test_unboxed_the_evaluate_py_attack_does_change_evaluate_py(tmp_path, new_build_dir):
    """The control: with the sandbox turned off, the same template does append to the copied evaluate.py, so
    the tests above test a real attack (and the copy is what it damages, not the checkout)."""
    project = copy_project(tmp_path)
    if "--sandbox" not in subprocess.run([sys.executable, "evaluate.py", "--help"], cwd=project,
                                         capture_output=True, text=True).stdout:
        pytest.skip("evaluate.py has no --sandbox flag yet")
    before = (project / "evaluate.py").read_bytes()
    records = [{"task": TASK, "code": attack("cpu", "append_evaluate_py", evaluate_py=str(project / "evaluate.py")),
                "id": "append_evaluate_py"}]
    done, rows = run_cli(project, records, tmp_path / "out.jsonl", new_build_dir(tmp_path / "builds"), "cpu",
                         "--sandbox", "off")
    assert done.returncode == 0, done.stderr[-3000:]
    after = (project / "evaluate.py").read_bytes()
    assert after != before and after.startswith(before) and b"# appended by a candidate" in after[len(before):]
    assert rows[0]["eval"]["status"] == "correct", rows[0]["eval"]["feedback"]
    assert (ROOT / "evaluate.py").read_bytes() != after  # the checkout's own copy is untouched


# --------------------------------------------------------------------------------------------------- GPU

@pytest.fixture(scope="module")
def cuda_runs(tmp_path_factory):
    folder = tmp_path_factory.mktemp("cuda")
    return attack_runs(folder, "cuda", workers=len(RUNS["separable"]), build_dir=folder / "builds")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("run", list(RUNS))
def test_the_sandbox_stops_the_cuda_attacks(run, cuda_runs):
    """The same attacks as CUDA kernels (--device cuda): the project unchanged, nothing in stdout, one output
    line per input in order, no connection, each attacker stopped, the honest candidates correct in this run
    and in a second one over the same build cache, every cached shared object still an ELF file."""
    seen = cuda_runs[run]
    assert seen["done"].returncode == 0, seen["done"].stderr[-3000:]
    assert seen["after"] == seen["before"]
    assert seen["done"].stdout == ""
    assert [(r.get("id"), r["code"]) for r in seen["rows"]] == [(r["id"], r["code"]) for r in seen["records"]]
    assert seen["connections"] == []
    for row in seen["rows"]:
        if str(row.get("id")).startswith("honest"):
            assert row["eval"]["status"] == "correct", (row["id"], row["eval"]["feedback"][:500])
        else:
            assert_stopped(row["eval"])
    assert [str(f) for f, magic in seen["shared_objects"].items() if magic != ELF] == []
    assert statuses(seen["again_rows"]) == {r["id"]: "correct" for r in seen["again_records"]}


def test_the_run_names_the_protections_in_force_in_one_line(separable):
    line = sandbox.describe(sandbox.available())
    assert line.startswith("sandbox: ") and line in separable["done"].stderr.splitlines()


def test_strict_runs_here_with_every_mechanism():
    assert sandbox_mechanisms("strict") == {m: True for m in sandbox.MECHANISMS}


def test_strict_refuses_a_kernel_that_lacks_a_mechanism(monkeypatch):
    """A fake: this machine's kernel has every mechanism, so one is taken away by replacing the probe."""
    monkeypatch.setattr(sandbox, "available", lambda: {"landlock": False, "namespaces": True, "seccomp": True})
    with pytest.raises(SystemExit, match="--sandbox strict, but this kernel lacks landlock"):
        sandbox_mechanisms("strict")


def test_a_helper_process_is_killed_at_the_fork_and_dev_shm_is_no_channel_between_candidates(tmp_path, new_build_dir):
    """Through the CLI on the CPU: a candidate that starts a process to outlive its child is rejected under
    [sandbox] and its helper never writes its marker; a candidate that leaves a message in /dev/shm and one,
    evaluated after it, that looks for it are both correct (each child has a /dev/shm of its own), and the
    host's /dev/shm never gets the message."""
    project = copy_project(tmp_path)
    marker, name = tmp_path / "helper-was-here", f"kevin-channel-{tmp_path.name}"
    records = [{"task": TASK, "code": attack("cpu", "start_process", marker=str(marker)), "id": "start_process"},
               {"task": TASK, "code": attack("cpu", "shm_write", name=name), "id": "shm_write"},
               {"task": TASK, "code": attack("cpu", "shm_read", name=name), "id": "shm_read"}]
    done, rows = run_cli(project, records, tmp_path / "out.jsonl", new_build_dir(tmp_path / "builds"), "cpu")
    assert done.returncode == 0, done.stderr
    got = {row["id"]: row["eval"] for row in rows}
    assert got["start_process"]["status"] == "rejected" and "[sandbox]" in got["start_process"]["feedback"]
    assert got["shm_write"]["status"] == got["shm_read"]["status"] == "correct", got
    time.sleep(5)  # what a helper that had escaped would have written by now
    assert not marker.exists() and not Path(f"/dev/shm/{name}").exists()


def reach_outside(tmp_path: Path, new_build_dir, *extra: str) -> dict:
    """Through the CLI on the CPU: a candidate that asks the fork server for a process (which would touch a marker),
    one that registers a host /dev/shm file with multiprocessing's resource tracker (which would unlink it as the
    evaluator exits), and an honest ReLU. What each got, and whether the marker appeared and the file survived."""
    project = copy_project(tmp_path)
    marker, name = tmp_path / "forked-outside-the-box", f"kevin-tracked-{tmp_path.name}"
    host_file = Path(f"/dev/shm/{name}")
    host_file.write_text("not the candidate's")
    records = [{"task": TASK, "code": attack("cpu", "ask_fork_server", marker=str(marker)), "id": "ask_fork_server"},
               {"task": TASK, "code": attack("cpu", "tell_resource_tracker", name=name), "id": "tell_resource_tracker"},
               {"task": TASK, "code": honest("cpu"), "id": "honest"}]
    try:
        done, rows = run_cli(project, records, tmp_path / "out.jsonl", new_build_dir(tmp_path / "builds"), "cpu", *extra)
        time.sleep(2)  # the tracker cleans up once the evaluator is gone; a forked process has run by now
        return dict(done=done, got={row["id"]: row["eval"] for row in rows}, marker=marker.exists(),
                    survived=host_file.exists())
    finally:
        host_file.unlink(missing_ok=True)


def test_no_process_outside_the_box_is_reachable_through_what_a_child_holds(tmp_path, new_build_dir):
    """Boxed, the fork server's socket cannot be connected to (the candidate's call fails with EACCES and nothing
    is forked) and the tracker's pipe is /dev/null in the child (the host file survives); the honest ReLU beside
    them is correct."""
    seen = reach_outside(tmp_path, new_build_dir)
    assert seen["done"].returncode == 0, seen["done"].stderr[-3000:]
    got = seen["got"]
    assert got["ask_fork_server"]["status"] == "runtime_error", got["ask_fork_server"]
    assert "Permission denied" in got["ask_fork_server"]["feedback"]
    assert got["honest"]["status"] == "correct", got["honest"]["feedback"]
    assert not seen["marker"] and seen["survived"]


def test_unboxed_both_routes_reach_a_process_outside(tmp_path, new_build_dir):
    """The control: with the sandbox off, the same two candidates are judged correct while the fork server forks
    their process (the marker appears) and the tracker unlinks the host's file, so the test above tests real
    routes."""
    seen = reach_outside(tmp_path, new_build_dir, "--sandbox", "off")
    assert seen["done"].returncode == 0, seen["done"].stderr[-3000:]
    assert {name: result["status"] for name, result in seen["got"].items()} == {
        "ask_fork_server": "correct", "tell_resource_tracker": "correct", "honest": "correct"}
    assert seen["marker"] and not seen["survived"]
