"""sandbox.confine on a real forked process: what a boxed-in child can and cannot reach."""
import json
import multiprocessing.resource_tracker
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from kevin import sandbox

MECHANISMS = sandbox.available()
ROOT = Path(__file__).resolve().parents[1]


def confined(tmp_path, probe, mechanisms=None, hidden=(), **options):
    """Run `probe()` in a forked child boxed in with only tmp_path/own writable (and `options` of confine); its JSON
    answer, or the signal that killed it."""
    return answer_of(start_confined(tmp_path, probe, mechanisms, hidden, **options))


def start_confined(tmp_path, probe, mechanisms=None, hidden=(), **options) -> tuple[int, int]:
    own = tmp_path / "own"
    own.mkdir(exist_ok=True)
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read_end)
        try:
            sandbox.confine([str(own)], sandbox.readable([str(tmp_path)], list(hidden)), mechanisms or MECHANISMS,
                            **options)
            answer = probe(own)
        except BaseException as e:  # noqa: BLE001 - the test reads it
            answer = {"error": repr(e)}
        os.write(write_end, json.dumps(answer).encode())
        os._exit(0)
    os.close(write_end)
    return pid, read_end


def answer_of(started: tuple[int, int]) -> dict:
    pid, read_end = started
    with os.fdopen(read_end) as f:
        text = f.read()
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        return {"signal": os.WTERMSIG(status)}
    return json.loads(text)


def attempt(action) -> str:
    try:
        action()
        return "done"
    except OSError as e:
        return e.strerror


needs_landlock = pytest.mark.skipif(not MECHANISMS["landlock"], reason="the kernel has no Landlock")
needs_seccomp = pytest.mark.skipif(not MECHANISMS["seccomp"], reason="the kernel has no seccomp")
needs_mount_namespace = pytest.mark.skipif(not MECHANISMS["mount_namespace"], reason="no mount namespaces here")


@needs_landlock
def test_a_confined_child_writes_its_own_folder_and_nothing_else(tmp_path):
    outside = tmp_path / "project.py"
    outside.write_text("original\n")

    def probe(own):
        return {"own": attempt(lambda: (own / "build.o").write_text("x")),
                "outside": attempt(lambda: open(outside, "a").write("tampered\n")),
                "delete": attempt(lambda: os.unlink(outside))}

    answer = confined(tmp_path, probe)
    assert answer == {"own": "done", "outside": "Permission denied", "delete": "Permission denied"}
    assert outside.read_text() == "original\n"


@needs_landlock
def test_a_confined_child_cannot_reach_its_parents_file_descriptors_or_folder(tmp_path):
    parent = os.getpid()
    answer = confined(tmp_path, lambda own: {
        "stdout": attempt(lambda: open(f"/proc/{parent}/fd/1", "w")),
        "cwd": attempt(lambda: os.readlink(f"/proc/{parent}/cwd")),
        "memory": attempt(lambda: open(f"/proc/{parent}/mem", "rb"))})
    assert set(answer.values()) == {"Permission denied"}


@needs_landlock
def test_a_hidden_folder_cannot_be_listed_though_its_siblings_are_read(tmp_path):
    (tmp_path / "secret").mkdir()
    (tmp_path / "readable.txt").write_text("fine")
    answer = confined(tmp_path, lambda own: {"list": attempt(lambda: os.listdir(tmp_path / "secret")),
                                             "parent": attempt(lambda: os.listdir(tmp_path))},
                      hidden=[str(tmp_path / "secret")])
    assert answer == {"list": "Permission denied", "parent": "Permission denied"}  # the holder is dropped whole
    assert sandbox.readable([str(tmp_path / "readable.txt")], [str(tmp_path / "secret")]).count(
        str(tmp_path / "readable.txt")) == 1


@needs_seccomp
def test_an_internet_socket_kills_the_child_with_sigsys(tmp_path):
    answer = confined(tmp_path, lambda own: {"socket": attempt(lambda: socket.socket(socket.AF_INET))})
    assert answer == {"signal": signal.SIGSYS}


@needs_seccomp
def test_a_unix_socket_pair_still_works_under_seccomp(tmp_path):
    answer = confined(tmp_path, lambda own: {"pair": attempt(socket.socketpair)})
    assert answer == {"pair": "done"}


@needs_seccomp
def test_connect_is_refused_so_only_given_channels_remain(tmp_path):
    """The fork server's socket (a path) and every other listener outside are out of reach: connect() answers
    EACCES; a new unix socket may be made (CUDA's driver fails to start without one: Error 304 in every runner on
    the H100), and a socket pair, connected from the start, still works (above)."""
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(tmp_path / "listener"))
    server.listen()

    def probe(own):
        a, _ = socket.socketpair()
        return {"socket": attempt(lambda: socket.socket(socket.AF_UNIX)),
                "connect": attempt(lambda: a.connect(str(tmp_path / "listener")))}

    answer = confined(tmp_path, probe)
    server.close()
    assert answer == {"socket": "done", "connect": "Permission denied"}


def map_twice(own) -> dict:
    """Map one page of a memory file, then its pages again at a second address (mremap of size 0, as a shared
    mapping allows); whether that gave one."""
    import ctypes
    import mmap

    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = libc.mremap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    libc.mremap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t, ctypes.c_int]
    fd = os.memfd_create("input")
    os.ftruncate(fd, mmap.PAGESIZE)
    first = libc.mmap(None, mmap.PAGESIZE, mmap.PROT_READ | mmap.PROT_WRITE, mmap.MAP_SHARED, fd, 0)
    second = libc.mremap(first, 0, mmap.PAGESIZE, 1)  # MREMAP_MAYMOVE
    return {"second": second not in (None, ctypes.c_void_p(-1).value)}


@needs_seccomp
def test_pages_already_mapped_cannot_be_mapped_again(tmp_path):
    """A second address for an input's pages would let an output be the input: the call kills (SIGSYS). Unboxed,
    the same call does give a second mapping, so the probe is a real one."""
    assert map_twice(None) == {"second": True}
    assert confined(tmp_path, map_twice) == {"signal": signal.SIGSYS}


@needs_seccomp
def test_a_confined_child_is_not_dumpable(tmp_path):
    import ctypes

    answer = confined(tmp_path, lambda own: {"dumpable": ctypes.CDLL(None).prctl(3, 0, 0, 0, 0)})  # PR_GET_DUMPABLE
    assert answer == {"dumpable": 0}


@pytest.mark.skipif(sandbox.landlock_abi() < 6, reason="Landlock scopes signals from ABI 6 on")
@pytest.mark.parametrize("scoped", [True, False])
def test_only_an_unscoped_child_may_signal_a_process_outside_its_box(tmp_path, scoped):
    """The judge stops and kills its runner, which is outside its box: it is confined unscoped; every other child
    may signal no process outside its own."""
    outside = subprocess.Popen(["sleep", "30"])
    try:
        answer = confined(tmp_path, lambda own: {"signal": attempt(lambda: os.kill(outside.pid, 0))}, scoped=scoped)
    finally:
        outside.kill()
        outside.wait()
    assert answer == {"signal": "Operation not permitted" if scoped else "done"}


@pytest.mark.skipif(not MECHANISMS["namespaces"], reason="no user and network namespaces here")
def test_the_network_namespace_has_no_route_to_localhost(tmp_path):
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    port = listener.getsockname()[1]

    def probe(own):
        s = socket.socket()
        return {"connect": attempt(lambda: s.connect(("127.0.0.1", port)))}

    answer = confined(tmp_path, probe, mechanisms=dict(MECHANISMS, seccomp=False))
    listener.close()
    assert answer["connect"] in ("Network is unreachable", "Permission denied")


def test_describe_names_what_is_on_and_what_is_missing():
    line = sandbox.describe({"landlock": False, "namespaces": True, "mount_namespace": True, "seccomp": True})
    assert line.startswith("sandbox: user+network namespaces")
    assert line.endswith("not available here: landlock")
    assert sandbox.describe({"landlock": True, "namespaces": True, "seccomp": True}).endswith(
        "not available here: mount_namespace")
    assert sandbox.describe({}) == "sandbox: off"


def fork_and_wait() -> None:
    if os.fork() == 0:
        os._exit(0)
    os.wait()


@needs_seccomp
@pytest.mark.parametrize("start", [fork_and_wait, lambda: os.system("true"), lambda: subprocess.run(["true"])],
                         ids=["fork", "os.system", "subprocess"])
def test_a_child_that_may_start_no_process_is_killed_by_sigsys_when_it_starts_one(tmp_path, start):
    answer = confined(tmp_path, lambda own: {"started": attempt(start)}, forbid_processes=True)
    assert answer == {"signal": signal.SIGSYS}


THREADS_CPP = r"""
#include <atomic>
#include <thread>
#include <vector>
extern "C" int std_threads(int n) {
    std::atomic<int> ran{0};
    std::vector<std::thread> threads;
    for (int i = 0; i < n; ++i) threads.emplace_back([&] { ++ran; });
    for (auto& t : threads) t.join();
    return ran;
}
extern "C" int openmp_threads() {
    int ran = 0;
    #pragma omp parallel num_threads(3)
    {
        #pragma omp atomic
        ++ran;
    }
    return ran;
}
"""


@needs_seccomp
def test_threads_still_start_where_processes_may_not(tmp_path):
    """Python's threads, C++'s std::thread, OpenMP's and torch's: clone3 answers ENOSYS, glibc takes clone. In a
    child forked from a fresh interpreter that has imported torch, as the fork server's are (its import runs
    ldconfig in a process): one forked from this test process could inherit an OpenMP pool that earlier tests
    started, and hang in it."""
    (tmp_path / "threads.cpp").write_text(THREADS_CPP)
    subprocess.run(["g++", "-shared", "-fPIC", "-fopenmp", "-pthread", str(tmp_path / "threads.cpp"), "-o",
                    str(tmp_path / "threads.so")], check=True)
    (tmp_path / "own").mkdir()
    probe = f"""
import ctypes, json, os, sys, threading
sys.path.insert(0, {str(ROOT)!r})
import torch
from kevin import sandbox
if os.fork():  # the parent: as the fork server, which has imported torch and run nothing on its threads
    sys.exit(os.waitstatus_to_exitcode(os.wait()[1]))
sandbox.confine([{str(tmp_path / "own")!r}], sandbox.readable([{str(tmp_path)!r}], []), {MECHANISMS!r},
                forbid_processes=True)
ran = []
threads = [threading.Thread(target=ran.append, args=(i,)) for i in range(4)]
[t.start() for t in threads]
[t.join() for t in threads]
native = ctypes.CDLL({str(tmp_path / "threads.so")!r})
torch.set_num_threads(2)
total = torch.ones(1 << 22).mul_(2).sum().item()  # past the grain size: on torch's thread pool
alive = int(next(line for line in open("/proc/self/status") if line.startswith("Threads:")).split()[1])
print(json.dumps({{"python": sorted(ran), "std::thread": native.std_threads(4), "openmp": native.openmp_threads(),
                  "torch": total, "pool": alive >= 2}}))
"""
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"python": [0, 1, 2, 3], "std::thread": 4, "openmp": 3, "torch": 2.0 * (1 << 22),
                                       "pool": True}


@needs_mount_namespace
def test_each_child_has_an_empty_dev_shm_of_its_own_that_goes_with_it(tmp_path):
    """What one child writes in /dev/shm another never sees, nor does the host, while it runs or after."""
    name = f"confine-test-{os.getpid()}"
    on_host = f"/dev/shm/{name}-host"
    written_r, written_w = os.pipe()
    go_r, go_w = os.pipe()

    def writer(own):
        with open(f"/dev/shm/{name}", "w") as f:
            f.write("a message to the next candidate")
        os.write(written_w, b"1")
        os.read(go_r, 1)  # alive until the other child has looked
        return {"sees": os.listdir("/dev/shm")}

    open(on_host, "w").close()
    try:
        first = start_confined(tmp_path, writer, private_shm=True)
        os.close(written_w)
        os.read(written_r, 1)
        second = confined(tmp_path, lambda own: {"sees": os.listdir("/dev/shm")}, private_shm=True)
        host_while_it_runs = os.path.exists(f"/dev/shm/{name}")
        os.write(go_w, b"1")
        assert answer_of(first) == {"sees": [name]}
    finally:
        os.unlink(on_host)
    assert second == {"sees": []}
    assert not host_while_it_runs and not os.path.exists(f"/dev/shm/{name}")


@needs_mount_namespace
def test_shared_memory_works_in_a_private_dev_shm(tmp_path):
    """Python's shared memory and torch's, in a child boxed in as run children are (no processes either); the
    resource tracker runs outside, and torch is imported before, as the evaluator's fork server does."""
    from multiprocessing import shared_memory

    import torch

    multiprocessing.resource_tracker.ensure_running()

    def probe(own):
        block = shared_memory.SharedMemory(create=True, size=1 << 20)
        block.buf[:5] = b"hello"
        again = shared_memory.SharedMemory(name=block.name)
        seen, listed = bytes(again.buf[:5]).decode(), os.listdir("/dev/shm")
        again.close()
        block.close()
        block.unlink()
        tensor = torch.arange(4.0).share_memory_()
        return {"seen": seen, "listed": listed == [block.name.lstrip("/")], "torch": tensor.is_shared()}

    assert confined(tmp_path, probe, private_shm=True, forbid_processes=True) == {
        "seen": "hello", "listed": True, "torch": True}


def test_a_made_up_request_from_a_child_is_answered_with_an_error_not_a_crash(tmp_path):
    """A child may send the evaluator anything; a request its service cannot take must come back as an error
    to that child, not end the evaluation."""
    from kevin import isolation

    def serve(request):
        return {"library": request["arguments"]["name"]}  # a TypeError for the list the child below sends

    settings = isolation.ChildSettings(env={})
    outcome = isolation.run_in_child(ask_something_odd, {}, settings, 60, str(tmp_path / "child.log"), serve=serve)
    assert outcome["reply"]["error"].startswith("a request the evaluator cannot answer: TypeError")


def ask_something_odd(payload: dict) -> dict:
    """A child's job that sends the evaluator a request of no known shape and returns what it was told."""
    import json
    import sys

    conn = next(o for o in __import__("gc").get_objects() if type(o).__name__ == "Connection" and not o.closed)
    conn.send_bytes(json.dumps({"request": ["not", "a", "dict"]}).encode())
    sys.stdout.flush()
    return {"reply": conn.recv()}


def test_children_wait_asleep_in_openmp_however_the_first_is_started(tmp_path):
    """The [threads] rule reads the CPU time of a runner's other threads; with OpenMP's threads spinning, the one
    that called forward hides theirs on a busy machine. The fork server must start with OpenMP waiting asleep
    whichever caller starts the first child (here a plain run_in_child, as the build cache's tests do), in a
    fresh process so that no earlier test has started it already."""
    script = f"""
import json, os, sys
sys.path[:0] = [{str(ROOT)!r}, {str(ROOT / "tests")!r}]
from kevin import isolation
import test_confine
child = isolation.run_in_child(test_confine.openmp_wait_policy, {{}}, isolation.ChildSettings(env={{}}), 60,
                               {str(tmp_path / "child.log")!r})
print(json.dumps({{**child, "caller": os.environ.get("OMP_WAIT_POLICY")}}))
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                          env={k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"})
    assert done.returncode == 0, done.stderr[-2000:]
    seen = json.loads(done.stdout.splitlines()[-1])
    assert (seen["policy"], seen["caller"]) == ("PASSIVE", None)  # the caller's own environment is as it was


def openmp_wait_policy(payload: dict) -> dict:
    """A child's job: the OpenMP wait policy its process (and the fork server it came from) started with."""
    return {"policy": os.environ.get("OMP_WAIT_POLICY")}


def test_each_gpu_keeps_two_cores_that_builds_stay_off():
    """A judge and a runner time on each GPU from two cores of their own, the highest by the GPU's index on the
    machine, so that one evaluator per GPU (CUDA_VISIBLE_DEVICES one each, as Ray and launchers set it) keeps
    different ones; other children stay off every GPU's pair. Too few cores a GPU, or a CPU, keep none."""
    from kevin.isolation import timing_cores

    assert timing_cores(["cuda:0"], list(range(16)), 1, None) == ({"cuda:0": (15, 14)}, tuple(range(14)))
    kept, others = timing_cores(["cuda:0", "cuda:1"], list(range(64)), 8, None)
    assert kept == {"cuda:0": (63, 62), "cuda:1": (61, 60)} and others == tuple(range(48))
    assert timing_cores(["cuda:0"], list(range(128)), 8, "5")[0] == {"cuda:0": (117, 116)}
    assert timing_cores(["cuda:0"], list(range(128)), 8, "7,5")[0] == {"cuda:0": (113, 112)}
    assert timing_cores(["cuda:0"], [0, 1, 2, 3, 4, 5, 6], 2, None) == ({}, ())
    assert timing_cores(["cpu"], list(range(16)), 0, None) == ({}, ())


def test_a_child_runs_on_its_cores_and_a_pinned_one_on_one_core_thread_by_thread(tmp_path):
    """`ChildSettings.cores` holds a child from its start; `pin` moves a running process onto a core, the threads
    it already has included and those it starts later, and says where it could not."""
    from kevin import isolation

    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        pytest.skip("needs two cores")
    settings = isolation.ChildSettings(env={}, cores=(cores[0],))
    assert isolation.run_in_child(affinity, {}, settings, 60, str(tmp_path / "child.log"))["cores"] == [cores[0]]

    threads = subprocess.Popen([sys.executable, "-c", """
import os, sys, threading, time
threading.Thread(target=time.sleep, args=(60,), daemon=True).start()
print("ready", flush=True)
sys.stdin.readline()
later = []
threading.Thread(target=lambda: later.append(sorted(os.sched_getaffinity(0)))).start()
time.sleep(0.5)
print(later[0], flush=True)
"""], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert threads.stdout.readline().strip() == "ready"
        assert not isolation.pin(threads.pid, {4095})  # a core the machine lacks: refused, and said
        assert isolation.pin(threads.pid, {cores[1]})
        tids = os.listdir(f"/proc/{threads.pid}/task")
        assert len(tids) >= 2 and all(os.sched_getaffinity(int(t)) == {cores[1]} for t in tids)
        threads.stdin.write("go\n")
        threads.stdin.flush()
        assert threads.stdout.readline().strip() == str([cores[1]])
    finally:
        threads.kill()
        threads.wait()
    assert not isolation.pin(threads.pid, {cores[1]})  # gone


def affinity(payload: dict) -> dict:
    """A child's job: the cores it may run on."""
    return {"cores": sorted(os.sched_getaffinity(0))}


def test_waiting_awake_ends_as_a_message_arrives_or_at_its_limit():
    """`wait_awake` returns once the other end has written (within a millisecond of it, not at its limit), and by
    itself after its limit when nothing comes, leaving the read to the caller."""
    import multiprocessing
    import threading
    import time

    from kevin.harness import wait_awake

    ours, theirs = multiprocessing.Pipe()
    sent = []
    threading.Timer(0.05, lambda: (sent.append(time.perf_counter()), theirs.send_bytes(b"go"))).start()
    wait_awake(ours, limit_s=5.0)
    assert time.perf_counter() - sent[0] < 0.05 and ours.recv_bytes() == b"go"
    began = time.perf_counter()
    wait_awake(ours, limit_s=0.1)
    assert 0.1 <= time.perf_counter() - began < 1.0 and not ours.poll()
