"""Runs candidate code in child processes, so that a crash, a hang or a poisoned CUDA context costs one child.

Children fork from a server process that has already imported torch, so each starts in milliseconds; each
gets its own process group (killed with everything it started), a log for its output, a file size limit, and
one payload. The job a child runs is passed in by reference (a module-level function, pickled by name), so
this module knows nothing of what is checked.
"""
from __future__ import annotations

import multiprocessing as mp
import os
import resource
import signal
import sys
import threading
import time
import traceback
from dataclasses import dataclass

import build_cache


@dataclass(frozen=True)
class ChildSettings:
    """What every child of one evaluation starts with: the build cache its extensions load from, the age at
    which a build lock counts as left behind by a killed build, torch's and CUDA's own environment variables,
    and whether it builds (it then yields the cores and claims the extensions it compiles)."""
    build_root: str
    stale_lock_s: float
    env: dict
    building: bool = False


_CONTEXT = None


def _mp_context():
    """Children fork from a server process that has imported torch but never touches CUDA, whatever
    the caller has done, so each starts in milliseconds instead of re-importing torch (~5 s on the H200
    machine). Only `torch` is preloaded: once torch.utils.cpp_extension is imported, torch's CUDA build
    refuses CUDA to forked children ("Cannot re-initialize CUDA in forked subprocess")."""
    global _CONTEXT
    if _CONTEXT is None:
        _CONTEXT = mp.get_context("forkserver")
        _CONTEXT.set_forkserver_preload(["torch"])
    return _CONTEXT


def _child_entry(conn, job, settings: ChildSettings, log_path: str, device: str | None):
    """Runs in the child: own process group, output to a log; sets up, waits for its one payload, runs
    `job(payload)` and sends the result (a dict) back through `conn`."""
    os.setpgrp()
    if settings.building:  # compilers yield the cores to a checking child timing a kernel beside them
        os.nice(10)
    resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 30, 1 << 30))  # a print loop cannot fill the disk
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)

    os.environ.update(settings.env)
    try:
        build_cache.content_addressed_load_inline(settings.build_root, settings.building, settings.stale_lock_s)
        if device and device.startswith("cuda"):
            _warm_up(device)
        failed = None
    except BaseException as e:  # noqa: BLE001 - reported as the result of the job it was waiting for
        failed = {"error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()}
    ready_at = time.time()
    payload = conn.recv()
    try:
        result = failed or job(payload)
    except BaseException as e:  # noqa: BLE001 - everything a candidate raises is a result, SystemExit too
        result = {"error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()}
    usage = [resource.getrusage(who) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)]
    result["cpu_s"] = sum(u.ru_utime + u.ru_stime for u in usage)  # compilers included: where the cores go
    result["ready_at"] = ready_at
    sys.stdout.flush()
    sys.stderr.flush()
    conn.send(result)
    conn.close()


def _warm_up(device: str) -> None:
    """What a GPU run needs before its candidate, done while the candidate before it is still running:
    the CUDA context, and torch._dynamo, which torch's profiler loads on first use (seconds together)."""
    import torch
    import torch._dynamo  # noqa: F401

    torch.cuda.set_device(device)
    torch.zeros(1, device=device)


def start_child(job, settings: ChildSettings, log_path: str, device: str | None = None) -> tuple:
    """A fresh child for `job`, a module-level function of one payload dict (pickled by name), started
    ahead: it sets itself up while it waits."""
    ctx = _mp_context()
    conn, child_end = ctx.Pipe()
    child = ctx.Process(target=_child_entry, args=(child_end, job, settings, log_path, device), daemon=True)
    child.start()
    child_end.close()
    return child, conn, log_path


def finish_child(started: tuple, payload: dict, timeout_s: float) -> dict:
    """Give a started child its payload and wait; {'timeout': True}, {'crash': ...} or the child's own
    result dict."""
    child, conn, log_path = started
    result, timed_out = None, False
    try:
        conn.send(payload)
        if conn.poll(timeout_s):
            result = conn.recv()  # EOFError: the child died without a word
        else:
            timed_out = True
    except (EOFError, OSError):
        result = None
    finally:
        conn.close()
    if result is not None:
        stop_child_later(started)
        return result
    child.join(timeout=0.5)  # dying: its exit code says how
    stop_child(started)
    if timed_out:
        return {"timeout": True}
    return {"crash": describe_exit(child.exitcode), "log": tail_of_log(log_path)}


def stop_child(started: tuple) -> None:
    """Kill a child and anything it started (ninja, nvcc), e.g. one started ahead and not needed."""
    child = started[0]
    try:
        os.killpg(child.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        child.kill()  # not (yet) the leader of its own process group
    child.join()


def stop_child_later(started: tuple) -> None:
    """stop_child in the background: the exit of a child that is done or not needed (seconds, with a CUDA
    context) is not waited for on the caller's path."""
    threading.Thread(target=stop_child, args=(started,), daemon=True).start()


def run_in_child(job, payload: dict, settings: ChildSettings, timeout_s: float, log_path: str) -> dict:
    """Run `job(payload)` in a fresh child; see finish_child."""
    return finish_child(start_child(job, settings, log_path), payload, timeout_s)


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
