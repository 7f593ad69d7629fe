"""The harness: what the judge's process and the runner's both run; it decides nothing.

Both sides start from the same task (`start_task`: the device made current, torch's thread count, a steady heap,
the task's module and its init inputs under the task's seed) and time with the same timer (`make_timer`: L2
flushed, CUDA events around the call, the host's wall clock around them and a device-wide synchronize; the wall
clock alone on the CPU): the runner the candidate's calls, under its kernel log, and the judge the reference's,
without one. The kernel log (`KernelLog`: torch's profiler, in the runner from before the candidate is imported to
its last call) is read by the judge's checks (`busy_ms`, `is_own_kernel`, `NEUTRAL_KERNEL`). Both list a model's
outputs alike (`flatten_outputs`) and compare them bitwise (`identical`).

What only the runner does is in runner.py; what the judge decides, in judge.py and judge_checks.py.
"""
from __future__ import annotations

import bisect
import contextlib
import importlib.util
import re
import resource
import select
import time

import torch


def import_file(path: str, name: str):
    """Execute a source file as a module (a task, or a candidate) without touching sys.modules."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# How long either side of a judged candidate, each on a core of its own, waits awake for the other's next message
# before its read sleeps as usual.
AWAKE_S = 0.2


def wait_awake(conn, limit_s: float = AWAKE_S) -> None:
    """Poll `conn` until a message is there or `limit_s` has passed: a process woken from sleep, on a core that went
    idle meanwhile, starts up to tens of µs late, and that lateness falls inside the judge's clock of a call. Only
    for a process on a core no other is given (`isolation.timing_cores`). One system call a look (the connection's
    own poll() makes a selector each time: 5 µs a look against 0.6)."""
    ready = select.poll()
    ready.register(conn.fileno(), select.POLLIN)
    deadline = time.perf_counter() + limit_s
    while not ready.poll(0) and time.perf_counter() < deadline:
        pass


def flatten_outputs(out) -> list:
    """A model's output as a list of outputs: a tuple or list as it is, anything else alone."""
    return list(out) if isinstance(out, (tuple, list)) else [out]


def identical(a, b) -> bool:
    """Bitwise equal, NaN included."""
    return torch.equal(a, b) or (a.is_floating_point() and a.shape == b.shape
                                 and torch.allclose(a, b, rtol=0, atol=0, equal_nan=True))


# Namespaces of library kernels (ATen, CUB, CUTLASS, ...): a candidate's kernel named like one of those
# is still theirs only if it is not in one of these.
LIBRARY_NAMESPACES = {"at", "native", "c10", "cub", "thrust", "cutlass", "cute", "cublas", "cudnn", "flash", "triton"}
# Work that computes nothing (allocation fills, copies): counted on neither side of the share.
NEUTRAL_KERNEL = re.compile(r"Memset|Memcpy|FillFunctor|direct_copy_kernel")


def is_own_kernel(event_name: str, names: list[str]) -> bool:
    """Whether a profiled kernel is one of the candidate's own __global__ functions (not a library kernel)."""
    qualified = re.sub(r"^void\s+|\(anonymous namespace\)::", "", event_name).split("(")[0].split("<")[0].strip()
    *namespaces, base = qualified.split("::")
    return base in names and not LIBRARY_NAMESPACES.intersection(namespaces)


class KernelLog:
    """Every GPU kernel of a run child, from before the candidate is imported to its last timed call, under
    torch's profiler (CUPTI), and the windows of the timed calls (a labelled range around each); in the timed
    calls whose time the judge reports, the GPU's side is off (`record`). CUPTI's instrumentation slows some
    kernels themselves (a one-thread-per-element tanh over 16M floats ran 0.451 ms under it and 0.415 ms
    without, on the H200; vectorised ones and matrix products not measurably): a reported time under it is
    not the kernel's. A candidate that tells the two kinds of call apart and does less in the unlogged ones is
    held to the logged ones' GPU time by the judge (`log_dodging`).

    The CPU activity records every aten op on the host, which the windows need: they are its ranges, and a
    range with no kernel in it leaves no trace on the GPU's side. Its cost, measured on a 2-core CPU machine
    with torch 2.13: about 0.5 µs per aten op (one torch.relu of 16 floats: 1.3 µs off, 1.8 µs on; as much
    after 200,000 recorded ops as at first), inside the clocks but alike for the candidate, the reference
    and the clean child's reference; a window's record_function costs ~6 µs more, outside the clocks.
    CUPTI's cost per kernel launch is the GPU's own and was not measured here."""

    def __init__(self):
        from torch.profiler import ProfilerActivity, profile, record_function

        self.profile = profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA])
        self.window = record_function
        self.gpu_side = [ProfilerActivity.CUDA]
        self.profile.__enter__()
        self.on = True

    def record(self, on: bool) -> None:
        """The GPU's side of the log on or off (about 1.3 ms on the host, outside any timed call); the host's side
        stays on, so that the windows of unlogged calls are still there."""
        if on != self.on:
            self.profile.toggle_collection_dynamic(on, self.gpu_side)
            self.on = on

    def stop(self, labels: set[str]) -> dict:
        """`windows`: label -> the (name, start µs, end µs) of each GPU kernel, copy and fill of the call timed in
        its window; `opened`: label -> when the call's GPU time began (µs); `spans`: label -> the window's
        (start, end) µs; `between`: the (start, end) µs of every kernel from the first window on that ran in
        none (the harness's copies of outputs, and whatever else ran between the timed calls). A window opens
        with the timer's L2 flush, the first kernel to start in it: it is left out, and its end is where the
        begin event is."""
        from torch.autograd import DeviceType

        self.profile.__exit__(None, None, None)
        windows, kernels = [], []
        for event in self.profile.events():
            if event.device_type == DeviceType.CPU and event.name in labels:
                windows.append((event.time_range.start, event.time_range.end, event.name))
            elif event.device_type == DeviceType.CUDA and event.name not in labels and not getattr(
                    event, "is_user_annotation", False):
                kernels.append((event.name, event.time_range.start, event.time_range.end))
        windows.sort()
        starts = [w[0] for w in windows]
        found, between = {label: [] for _, _, label in windows}, []
        for name, start, end in sorted(kernels, key=lambda k: k[1]):
            i = bisect.bisect_right(starts, start) - 1
            if i >= 0 and start <= windows[i][1]:
                found[windows[i][2]].append((name, start, end))
            elif i >= 0:
                between.append((start, end))
        opened = {label: call.pop(0)[2] for label, call in found.items() if call and NEUTRAL_KERNEL.search(call[0][0])}
        return {"windows": found, "opened": opened, "between": between,
                "spans": {label: (start, end) for start, end, label in windows}}


def busy_ms(kernels: list[tuple[str, float, float]], since: float = -float("inf")) -> float:
    """How long some kernel was running from `since` (µs) on, in ms: the union of their intervals (kernels on
    streams overlap)."""
    busy, reach = 0.0, since
    for _, start, end in sorted(kernels, key=lambda k: k[1]):
        busy += max(0.0, end - max(start, reach))
        reach = max(reach, end)
    return busy / 1e3


def make_timer(cuda: bool, flush: torch.Tensor | None, kernel_log: KernelLog | None):
    """timed(fn, args, label) -> (CUDA events' ms, the host's wall-clock ms, output): inside the kernel log's
    window named `label`, L2 flushed, then events around the call and the host's clock around the events and a
    device-wide synchronize, so that three clocks see each call; on the CPU the wall clock alone (reported
    twice). The flush is still running as the call is launched, as a busy GPU would be: the launch's latency
    is hidden behind it (about 20 µs a call on the H200, `bench/timer_protocols.py`), and the closing event
    waits for no round trip through the host (25 to 65 µs). Work on a side stream the current stream never
    waited for is outside the events; the kernel log counts it in the logged calls (judge_checks.py's `log_dodging`)."""
    perf_counter = time.perf_counter
    if not cuda:
        def timed(fn, args: list, label: str) -> tuple[float, float, object]:
            begin = perf_counter()
            out = fn(*args)
            ms = (perf_counter() - begin) * 1e3
            return ms, ms, out
        return timed
    window = kernel_log.window if kernel_log else lambda label: contextlib.nullcontext()
    Event, synchronize = torch.cuda.Event, torch.cuda.synchronize

    def timed(fn, args: list, label: str) -> tuple[float, float, object]:
        synchronize()  # the inputs made: nothing from before runs into the window
        begin, end = Event(enable_timing=True), Event(enable_timing=True)
        with window(label):
            flush.zero_()  # evict the inputs and last results from L2: the window's first kernel
            wall = perf_counter()
            begin.record()
            out = fn(*args)
            end.record()
            synchronize()  # device-wide, inside the window: every kernel of the call, on any stream, is in it
            wall = perf_counter() - wall
        return begin.elapsed_time(end), wall * 1e3, out
    return timed


def steady_heap() -> None:
    """Keep freed memory in this process's heap, however large the block (glibc's mallopt): an output freed and
    made again costs no page faults, in the judge's process and the runner's alike, so that CPU time measures
    the work and not the allocator's traffic with the kernel (half a millisecond a call for 1 MB outputs)."""
    import ctypes

    libc = ctypes.CDLL(None)
    libc.mallopt(-1, 2**31 - 1)  # M_TRIM_THRESHOLD: never give the heap's top back
    libc.mallopt(-3, 2**30)  # M_MMAP_THRESHOLD: blocks up to 1 GiB come from the heap, not their own mapping


def peak_resident_bytes() -> int:
    """This process's resident high-water mark (the judge's and the runner's memory on the CPU)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


FLUSH_BYTES = 512 * 2**20


def flush_buffer(device: torch.device) -> torch.Tensor | None:
    """512 MB to write before each timed call, so that no call finds its inputs in L2 (None on the CPU), and long
    enough to write (about 0.12 ms on the H200) that a Python model's first launch is queued before it ends:
    behind 256 MB, some calls' first kernels came after the flush had ended and the gap counted (up to 19 µs)."""
    return torch.empty(FLUSH_BYTES // 4, dtype=torch.int32, device=device) if device.type == "cuda" else None


def start_task(payload: dict) -> tuple[torch.device, object, list]:
    """What the judge and the runner both start from: the device (made current), torch's thread count, a steady
    heap, the task's module and its init inputs under the task's seed."""
    device = torch.device(payload["device"])
    if device.type == "cuda":
        torch.cuda.set_device(device)
    torch.set_num_threads(payload["cpu_threads"])
    steady_heap()
    task = import_file(payload["task"], "reference_task")
    torch.manual_seed(payload["seed"])
    return device, task, task.get_init_inputs()
