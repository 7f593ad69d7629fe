"""Runs candidate code in child processes, boxed in, so that a crash, a hang or an attack costs one child.

Children fork from a server process that has already imported torch, so each starts in milliseconds; each
gets its own process group (killed with everything it started), a log for its output (never the evaluator's
stdout), a file size limit, a private temporary folder, and one payload. Before it runs anything of the
candidate's it boxes itself in (sandbox.py): writable are only its temporary folder and what its job names.
A child talks to the evaluator in JSON, never pickle (unpickling runs code), and may ask it for services
(`serve`: the build cache's extensions) before it sends its result. The job a child runs is passed in by
reference (a module-level function, pickled by name), so this module knows nothing of what is checked.
"""
from __future__ import annotations

import atexit
import contextlib
import fcntl
import json
import multiprocessing as mp
import multiprocessing.forkserver
import multiprocessing.resource_tracker
import multiprocessing.util
import os
import resource
import shutil
import signal
import sys
import tempfile
import threading
import time
import traceback
import types
from dataclasses import dataclass, field

from kevin import sandbox


@dataclass(frozen=True)
class ChildSettings:
    """What every child of one kind starts with: torch's and CUDA's own environment variables, the folders it
    may read and the sandbox mechanisms it applies (`sandbox.available()`, or none), a `setup(ask)` run
    before the payload (module-level, pickled by name: the build cache's load_inline), whether it yields
    the cores (builds do, to a checking child timing a kernel beside them), whether it runs candidate code
    (then it may start no process: nothing of the candidate's outlives the child), whether no file it
    writes may pass 1 GiB (all but the judge, whose shared memory holds a task's outputs, whatever their size),
    whether Landlock keeps it from signalling processes outside its box (all but the judge, which stops
    and kills its runner), and the cores it may run on (all where empty; `timing_cores`)."""
    env: dict
    readable: tuple[str, ...] = ()
    mechanisms: dict = field(default_factory=dict)
    setup: object = None
    nice: bool = False
    runs_candidate: bool = False
    limit_files: bool = True
    scoped: bool = True
    cores: tuple[int, ...] = ()


_CONTEXT = None
_SERVER_START = threading.Lock()


def _mp_context():
    """Children fork from a server process that has imported torch but never touches CUDA, whatever
    the caller has done, so each starts in milliseconds instead of re-importing torch (~5 s on the H200
    machine); torch._dynamo too, which every runner imports (2 CPU-seconds each). Nothing more: once
    torch.utils.cpp_extension is imported, torch's CUDA build refuses CUDA to forked children ("Cannot
    re-initialize CUDA in forked subprocess"); importing torch._dynamo neither imports it nor asks CUDA anything."""
    global _CONTEXT
    if _CONTEXT is None:
        _CONTEXT = mp.get_context("forkserver")
        _CONTEXT.set_forkserver_preload(["torch", "torch._dynamo"])
    return _CONTEXT


def start_fork_server() -> None:
    """Start the fork server now, with the terminal's Ctrl-C blocked in this thread (its exec keeps
    the mask, and it ignores Ctrl-C once it has imported torch): a server that Ctrl-C kills while it imports
    torch fails the next child's start with an EOFError in whatever thread starts it. Blocked, not ignored:
    a Ctrl-C meanwhile waits, and is raised in the main thread as the mask is lifted (or at once, by a thread
    that has it unblocked). The caller stops the children itself (`stop_every_child`).

    The server starts with OpenMP's threads waiting asleep (OMP_WAIT_POLICY=PASSIVE): torch's libgomp, which a
    candidate's own OpenMP shares, reads the policy once, as the server imports torch. Spinning, the thread that
    called forward waits at each barrier for as long as the others are off a core, so on a busy machine its CPU
    time hid theirs from the [threads] rule (an OpenMP Swish judged correct in 2 of 5 runs beside two niced
    busy processes; 0 of 5 passive). Every child's start comes through here, so that no caller can start the
    server another way (the suite's earlier tests once did, and the rule then missed the Swish again)."""
    _mp_context()
    with _SERVER_START:  # the environment is the process's: one thread at a time sets it and puts it back
        multiprocessing.resource_tracker.ensure_running()  # first: starting, it unblocks Ctrl-C whatever the caller did
        previous = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        policy = os.environ.get("OMP_WAIT_POLICY")
        os.environ["OMP_WAIT_POLICY"] = "PASSIVE"
        try:
            multiprocessing.forkserver.ensure_running()
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, previous)
            if policy is None:
                os.environ.pop("OMP_WAIT_POLICY")
            else:
                os.environ["OMP_WAIT_POLICY"] = policy


@atexit.register
def _stop_fork_server() -> None:
    """At exit the fork server (where this process started one) goes at once. Left alone it would notice only
    once it has imported torch and then tear torch down (up to ~3 s of a core after a short run), all the while
    holding the caller's stdout and stderr open: the next stage of a pipeline, or whoever reads them, would wait
    for it. It has no state to keep."""
    pid = getattr(multiprocessing.forkserver._forkserver, "_forkserver_pid", None)
    if pid:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)


def hidden_from_children() -> list[str]:
    """What no child may list: the folder of the fork server's socket (Landlock does not stop a process
    connecting to a socket whose path it knows, and the server forks whatever it is sent, unboxed)."""
    return [multiprocessing.util.get_temp_dir()]


def _child_entry(conn, lifeline, job, settings: ChildSettings, log_path: str, device: str | None, tmp: str,
                 writable: list, peer=None):
    """Runs in the child: own process group, output to a log, boxed in; sets up, waits for its one payload,
    runs `job(payload)` and sends the result (a dict) back through `conn`. When the evaluator is gone, however
    it went (kill -9 included), the lifeline's end closes and the kernel sends this process SIGIO, which it
    does not handle: it dies too, even inside a kernel that never returns."""
    alive = lifeline.fileno()  # `lifeline` stays open as long as this function runs
    fcntl.fcntl(alive, fcntl.F_SETOWN, os.getpid())
    fcntl.fcntl(alive, fcntl.F_SETFL, fcntl.fcntl(alive, fcntl.F_GETFL) | os.O_ASYNC)
    os.setpgrp()
    if settings.cores:
        os.sched_setaffinity(0, settings.cores)
    if settings.nice:
        os.nice(10)
    if settings.limit_files:
        resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 30, 1 << 30))  # a print loop cannot fill the disk
    try:
        fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    except FileNotFoundError:  # a spare started as its caller stopped and removed the folder: nothing to do
        os._exit(0)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    if any(settings.mechanisms.values()):
        _only_own_descriptors([conn.fileno(), alive, *([peer.fileno()] if peer is not None else [])])
    os.environ.update(settings.env)
    for name in ("TMPDIR", "TORCH_EXTENSIONS_DIR", "CUDA_CACHE_PATH", "TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR"):
        os.environ[name] = tmp  # what torch, CUDA, Triton and Inductor would write elsewhere: the private folder
    tempfile.tempdir = None
    try:
        sandbox.confine([tmp, *writable], list(settings.readable), settings.mechanisms,
                        forbid_processes=settings.runs_candidate, private_shm=True, scoped=settings.scoped)
        if settings.setup is not None:
            settings.setup(lambda request: _ask(conn, request))
        if device and device.startswith("cuda"):
            _warm_up(device)
        failed = None
    except BaseException as e:  # noqa: BLE001 - reported as the result of the job it was waiting for
        failed = {"error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()}
    ready_at = time.time()
    payload = conn.recv()
    try:
        result = failed or (job(payload) if peer is None else job(payload, peer))
    except BaseException as e:  # noqa: BLE001 - everything a candidate raises is a result, SystemExit too
        result = {"error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()}
    usage = [resource.getrusage(who) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)]
    result["cpu_s"] = sum(u.ru_utime + u.ru_stime for u in usage)  # compilers included: where the cores go
    result["ready_at"] = ready_at
    sys.stdout.flush()
    sys.stderr.flush()
    conn.send_bytes(json.dumps(result, default=str).encode())
    conn.close()


def _only_own_descriptors(own: list[int]) -> None:
    """Every descriptor a child inherited but its log and `own` (its channels) made /dev/null: the fork server's
    and multiprocessing's resource tracker's pipes are ends of processes outside the box (the tracker unlinks
    whatever names it is sent, unboxed). The same numbers stay open, so that code holding one writes nowhere
    instead of into a descriptor opened later under that number."""
    inherited = [int(fd) for fd in os.listdir("/proc/self/fd") if int(fd) > 2 and int(fd) not in own]
    null = os.open(os.devnull, os.O_RDWR)
    for fd in inherited:
        with contextlib.suppress(OSError):  # the listing's own descriptor, closed once listed
            os.fstat(fd)
            os.dup2(null, fd)
    os.close(null)


def _ask(conn, request: dict) -> dict:
    """A request from the child to the evaluator, answered before the child goes on."""
    conn.send_bytes(json.dumps({"request": request}).encode())
    return conn.recv()


def _warm_up(device: str) -> None:
    """What a GPU run needs before its candidate, done while the candidate before it is still running:
    the CUDA context, and torch._dynamo, which torch's profiler loads on first use (seconds together)."""
    import torch
    import torch._dynamo  # noqa: F401

    torch.cuda.set_device(device)
    torch.zeros(1, device=device)


_STARTING = threading.Lock()


@contextlib.contextmanager
def _caller_script_hidden():
    """multiprocessing has a forkserver child run the caller's script again (as __mp_main__) before its target,
    unless __main__ names no file. A child here needs none of it (its job is a function of this package), and
    it would cost seconds of imports a child (train.py's transformers and accelerate), and a thread one of them
    starts would make the sandbox's new user namespace impossible (unshare refuses a process of two threads):
    so a child starts with a stand-in __main__. A job defined in the script is then a pickling error here."""
    with _STARTING:
        script = sys.modules["__main__"]
        sys.modules["__main__"] = types.ModuleType("__main__")
        try:
            yield
        finally:
            sys.modules["__main__"] = script


def start_child(job, settings: ChildSettings, log_path: str, device: str | None = None,
                writable: list[str] = (), peer=None) -> tuple:
    """A fresh child for `job`, a module-level function of one payload dict (pickled by name), started
    ahead: it sets itself up while it waits. It may write its private folder (made here, next to its log,
    removed with it) and `writable`. With `peer`, one end of `peers()`, the job is `job(payload, peer)`: it
    talks to the child holding the other end directly, not through this process."""
    start_fork_server()  # a no-op once it runs
    ctx = _mp_context()
    tmp = tempfile.mkdtemp(prefix="tmp-", dir=os.path.dirname(log_path))
    conn, child_end = ctx.Pipe()
    lifeline, held = ctx.Pipe(duplex=False)  # `held`, never written, closes with this process: the child ends
    child = ctx.Process(target=_child_entry, args=(child_end, lifeline, job, settings, log_path, device, tmp,
                                                   list(writable), peer), daemon=True)
    with _caller_script_hidden():
        child.start()
    child_end.close()
    lifeline.close()
    if peer is not None:
        peer.close()  # the child has its own copy: this end must close with the child
    return child, conn, log_path, tmp, held


def peers() -> tuple:
    """Two ends of a socket for two children to talk over (each passed to `start_child` as `peer`)."""
    return _mp_context().Pipe()


def finish_child(started: tuple, payload: dict, timeout_s: float, serve=None, stop_on_result: bool = True) -> dict:
    """Give a started child its payload and wait; {'timeout': True}, {'crash': ..., 'signal': ...} or the
    child's own result dict. Its requests are answered by `serve(request)` meanwhile, and the time spent
    answering is not the child's: it is not counted against `timeout_s`. A reply {'timeout': True} from
    `serve` ends the child as timed out. Without `stop_on_result` a child that answers is left to the caller
    to stop: one whose answer is no result (it may be forged) must not be ended by it."""
    child, conn, log_path, *_ = started
    result, timed_out, deadline = None, False, time.monotonic() + timeout_s
    try:
        conn.send(payload)
        while True:
            if not conn.poll(max(0.0, deadline - time.monotonic())):
                timed_out = True
                break
            message = json.loads(conn.recv_bytes())  # EOFError: the child died without a word
            if not isinstance(message, dict):
                raise ValueError("a child's message is a JSON object")
            if "request" not in message or serve is None:
                result = message
                break
            began = time.monotonic()
            try:
                reply = serve(message["request"])
            except Exception as e:  # noqa: BLE001 - a request the child made up must not end the evaluator
                reply = {"error": f"a request the evaluator cannot answer: {type(e).__name__}: {e}"}
            deadline += time.monotonic() - began
            if reply.get("timeout"):
                timed_out = True
                break
            conn.send(reply)
    except (EOFError, OSError, ValueError):  # json's errors are ValueErrors: a garbled result is no result
        result = None
    finally:
        conn.close()
    if result is not None:
        if stop_on_result:
            stop_child_later(started)
        return result
    child.join(timeout=0.5)  # dying: its exit code says how
    stop_child(started)
    if timed_out:
        return {"timeout": True}
    killed_by = -child.exitcode if child.exitcode < 0 else None
    return {"crash": describe_exit(child.exitcode), "signal": killed_by, "log": tail_of_log(log_path)}


def cpu_seconds(pid: int) -> float | None:
    """The CPU time of a process that has not been reaped yet (all its threads, exited ones included), read by
    its parent from /proc: what a child says of itself is not needed, nor its answer. None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def timing_cores(devices: list[str], cores: list[int], gpus: int, visible: str | None
                 ) -> tuple[dict[str, tuple[int, int]], tuple[int, ...]]:
    """(two cores for each GPU of `devices` ('cuda:N'), one for the judge and one for the runner timing on it; the
    cores every other child runs on, `ChildSettings.cores`): of `cores`, where there are at least four for each
    of the machine's `gpus`; none kept apart otherwise, and none for a CPU. Compiles on every core once moved the
    judge's clock of an honest call by half a millisecond either way, more than a small kernel takes. The highest
    cores are kept, two by two by the GPU's index on the machine (`visible`: CUDA_VISIBLE_DEVICES undone), so that
    the evaluators of one machine's GPUs (a rank or a Ray pool each) keep different ones and all their builds keep
    off every one."""
    cores = sorted(cores)
    if not devices or devices[0] == "cpu" or not gpus or len(cores) < 4 * gpus:
        return {}, ()
    ids = (visible or "").split(",")
    kept = {}
    for device in devices:
        index = int(device.split(":")[1])
        on_machine = int(ids[index]) if index < len(ids) and ids[index].strip().isdigit() else index
        if on_machine >= gpus:
            return {}, ()
        kept[device] = (cores[-2 * on_machine - 1], cores[-2 * on_machine - 2])
    return kept, tuple(cores[:len(cores) - 2 * gpus])


def gpus_on_machine() -> int:
    """The machine's GPUs, those CUDA_VISIBLE_DEVICES hides included: NVML's count (what the driver shows this
    container), or torch's where NVML is missing."""
    import ctypes

    import torch

    count = ctypes.c_uint(0)
    try:
        nvml = ctypes.CDLL("libnvidia-ml.so.1")
        if nvml.nvmlInit_v2() == 0:
            nvml.nvmlDeviceGetCount_v2(ctypes.byref(count))
            nvml.nvmlShutdown()
    except OSError:
        pass
    return max(count.value, torch.cuda.device_count())


def pin(pid: int, cores) -> bool:
    """Every thread of process `pid` moved onto `cores` (threads it starts later stay there too); False where the
    system refused (a container's limits, say: the caller goes on unpinned) or the process is gone."""
    for _ in range(2):  # a thread started while the first pass ran is caught by the second
        try:
            for thread in os.listdir(f"/proc/{pid}/task"):
                with contextlib.suppress(ProcessLookupError, FileNotFoundError):  # a thread that has exited
                    os.sched_setaffinity(int(thread), cores)
        except OSError:
            return False
    return True


def stop_child(started: tuple) -> None:
    """Kill a child and anything it started (ninja, nvcc), e.g. one started ahead and not needed, and
    remove its private folder."""
    child, _, _, tmp, _ = started
    try:
        os.killpg(child.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        child.kill()  # not (yet) the leader of its own process group
    child.join()
    shutil.rmtree(tmp, ignore_errors=True)


def stop_every_child() -> None:
    """Kill every child this process has started that is still alive, and what each started: on an interrupt,
    when no child's answer is wanted any more."""
    for child in multiprocessing.active_children():
        try:
            os.killpg(child.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            child.kill()


def stop_child_later(started: tuple) -> None:
    """stop_child in the background: the exit of a child that is done or not needed (seconds, with a CUDA
    context) is not waited for on the caller's path."""
    threading.Thread(target=stop_child, args=(started,), daemon=True).start()


def run_in_child(job, payload: dict, settings: ChildSettings, timeout_s: float, log_path: str,
                 writable: list[str] = (), serve=None) -> dict:
    """Run `job(payload)` in a fresh child; see start_child and finish_child."""
    return finish_child(start_child(job, settings, log_path, writable=writable), payload, timeout_s, serve)


def describe_exit(code: int) -> str:
    """A child's exit code in words, for the feedback."""
    if code < 0:
        try:
            return f"the process was killed by signal {signal.Signals(-code).name}"
        except ValueError:
            return f"the process was killed by signal {-code}"
    return f"the process exited with code {code}"


def tail_of_log(path: str, limit: int = 4000) -> str:
    """The last `limit` bytes of a child's log: where a crash says what happened."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - limit))
            return f.read().decode(errors="replace")
    except OSError:
        return ""
