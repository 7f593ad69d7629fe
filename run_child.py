"""What the checks stand on inside a run child: its state, the timer, the profiler and the tamper check.

evaluate.py's checks (correctness, the own-kernel share, timing) say what a candidate must do; this is how
they look: inputs made on the device, memory poisoned with NaN, outputs probed before a synchronize, an
independent draw of inputs for every timed call, the timer (L2 flushed, CUDA events around the call, the
host's wall clock around them and a device-wide synchronize; the wall clock alone on the CPU), the kernel log
(torch's profiler on from before the candidate is imported to the last timed call, so that every call looks
alike to it; it also times each call's kernels on every stream), the process-wide settings the reference
runs under, and the identities of everything the checks call, C-level types' methods included, so that a
candidate that replaces one is caught.
"""
from __future__ import annotations

import bisect
import builtins
import contextlib
import importlib.util
import json
import re
import sys
import threading
import time

import torch


def import_file(path: str, name: str):
    """Execute a source file as a module (a task, or a candidate) without touching sys.modules."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def flatten_outputs(out) -> list:
    """A model's output as a list of outputs: a tuple or list as it is, anything else alone."""
    return list(out) if isinstance(out, (tuple, list)) else [out]


def identical(a, b) -> bool:
    """Bitwise equal, NaN included."""
    return torch.equal(a, b) or (a.is_floating_point() and a.shape == b.shape
                                 and torch.allclose(a, b, rtol=0, atol=0, equal_nan=True))


def trusted_objects(judge) -> dict:
    """Everything the check and the timing call, by identity: a candidate that replaces one is rejected.
    Every method of torch.Tensor, every builtin, torch's and torch.cuda's functions, torch._C's functions and
    the methods and descriptors of its C-level types (TensorBase, _CudaEventBase, whose elapsed_time
    torch.cuda.Event calls, ...) and of torch.cuda's classes, which native code can replace without touching
    a Python-level object, this module's own and RunChild's, and those of `judge`, the module whose checks
    call them."""
    owners = {"torch": torch, "torch.cuda": torch.cuda, "torch.Tensor": torch.Tensor, "torch._C": torch._C,
              "builtins": builtins, "time": time, "run_child": sys.modules[__name__], "run_child.RunChild": RunChild,
              "evaluate": judge}
    for label, module in (("torch._C", torch._C), ("torch.cuda", torch.cuda)):
        owners.update({f"{label}.{name}": t for name, t in vars(module).items() if isinstance(t, type)})
    return {f"{label}.{name}": value for label, owner in owners.items() for name, value in vars(owner).items()
            if callable(value) or hasattr(type(value), "__get__")}


# The clock the timer reads, torch.cuda.Event, is a C-level type underneath, immutable from Python: a
# replaced method of it is native code faking the clock. Python-level timers and synchronize replaced are
# a patched checker like any other trusted object.
CLOCKS = re.compile(r"^torch\._C\._CudaEventBase\.")


class ProcessSettings:
    """Every process-wide setting that changes how fast, or how exactly, PyTorch runs the reference, noted
    before the candidate is imported: each zero-argument getter of torch._C (cuDNN, TF32, cuBLAS reduced
    precision, matmul precision, deterministic modes, SDPA kernels, mkldnn, nnpack, autocast, the
    torch-function and dispatch mode stacks, ...), torch's thread counts, grad, inference and anomaly modes,
    the default dtype, and flush-to-zero of denormals (which has no getter: a denormal times one tells)."""

    GETTERS = ("_get_", "_is_", "_len_")

    def __init__(self):
        self.getters = {}
        for name, getter in vars(torch._C).items():
            if name.startswith(self.GETTERS) and callable(getter):
                try:  # a getter that needs arguments, or a backend this build lacks, is no setting of this run
                    value = getter()
                except Exception:  # noqa: BLE001
                    continue
                if isinstance(value, (bool, int, float, str)):
                    self.getters[f"torch._C.{name}"] = getter
        self.getters.update({
            "torch.get_num_threads": torch.get_num_threads,
            "torch.get_num_interop_threads": torch.get_num_interop_threads,
            "torch.is_grad_enabled": torch.is_grad_enabled,
            "torch.is_inference_mode_enabled": torch.is_inference_mode_enabled,
            "torch.is_anomaly_enabled": torch.is_anomaly_enabled, "torch.get_default_dtype": torch.get_default_dtype,
            "flush-to-zero of denormals": lambda: float(torch.full((1,), 1e-40).mul(1.0)) == 0.0})
        self.noted = self.now()

    def now(self) -> dict:
        return {name: getter() for name, getter in self.getters.items()}

    def changed(self) -> str | None:
        """The first setting that is no longer what it was, in words; None if none is."""
        now = self.now()
        for name, value in self.noted.items():
            if now[name] != value:
                return f"{name} ({value!r} -> {now[name]!r})"
        return None


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
    torch's profiler (CUPTI), and the windows of the timed calls (a labelled range around each). Being on
    all along, the profiler is the same for every call: a candidate cannot tell a profiled call from a
    timed one, nor from a checked one.

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
        self.profile.__enter__()

    def stop(self, labels: set[str]) -> tuple[dict[str, list[tuple[str, float, float]]], dict[str, float]]:
        """(label -> the (name, start µs, end µs) of each GPU kernel, copy and fill of the call timed in its
        window, label -> when the call's GPU time began, in µs). A window opens with the timer's L2 flush, the
        first kernel to start in it: it is left out, and its end is where the begin event is."""
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
        found = {label: [] for _, _, label in windows}
        for name, start, end in sorted(kernels, key=lambda k: k[1]):
            i = bisect.bisect_right(starts, start) - 1
            if i >= 0 and start <= windows[i][1]:
                found[windows[i][2]].append((name, start, end))
        opened = {label: call.pop(0)[2] for label, call in found.items() if call and NEUTRAL_KERNEL.search(call[0][0])}
        return found, opened


def busy_ms(kernels: list[tuple[str, float, float]], since: float = -float("inf")) -> float:
    """How long some kernel was running from `since` (µs) on, in ms: the union of their intervals (kernels on
    streams overlap)."""
    busy, reach = 0.0, since
    for _, start, end in sorted(kernels, key=lambda k: k[1]):
        busy += max(0.0, end - max(start, reach))
        reach = max(reach, end)
    return busy / 1e3


def span_ms(kernels: list[tuple[str, float, float]], since: float) -> float:
    """From `since` (µs), or an earlier start of one of the kernels, to the last end of one, in ms."""
    if not kernels:
        return 0.0
    return (max(k[2] for k in kernels) - min(since, min(k[1] for k in kernels))) / 1e3


def clone(inputs: list) -> list:
    return [x.clone() if isinstance(x, torch.Tensor) else x for x in inputs]


def changed(before: list, after: list) -> bool:
    return any(isinstance(b, torch.Tensor) and not identical(b, a) for b, a in zip(before, after))


def probe(out) -> list:
    """A few elements of each output, copied to the host in order on the current stream: what a caller
    reading the result right away would see. Copies, unlike kernels, are not held back by a kernel still
    filling the GPU on another stream."""
    probes = []
    for o in flatten_outputs(out):
        if isinstance(o, torch.Tensor) and o.is_contiguous() and o.numel():
            flat = o.reshape(-1)
            picks = sorted({round(i * (o.numel() - 1) / 7) for i in range(8)})
            probes.append(torch.cat([flat[i:i + 1].to("cpu", copy=True) for i in picks]))
    return probes


# One product of the busy work beside a repeated run: 17 GFLOP, ~0.35 ms in fp32 on an H100 or H200.
BUSY_SIZE = 2048
BUSY_PRODUCT_MS = 0.35


def busy_side_stream(device: torch.device, ms: float) -> list:
    """Queue about `ms` of matrix products (at most 200) on a new stream, to run beside whatever the current
    stream does next: the SMs a kernel's blocks would have had are taken and given back at other moments, so
    its blocks and warps are scheduled differently than when it ran alone, and a race lands elsewhere. The
    tensors to keep alive until the device is synchronised are returned."""
    stream = torch.cuda.Stream(device)
    stream.wait_stream(torch.cuda.current_stream(device))  # after the poison and the clones, not beside them
    with torch.cuda.stream(stream):
        a = torch.full((BUSY_SIZE, BUSY_SIZE), 1e-3, device=device)  # no draws: the seeded generator is left alone
        product = torch.empty_like(a)
        for _ in range(max(1, min(200, round(ms / BUSY_PRODUCT_MS)))):
            torch.mm(a, a, out=product)
    return [stream, a, product]


class RunChild:
    """What the checks and the timing share inside one run child: the payload, the device, the task, and
    the seconds each step took. Its methods are trusted objects too (`trusted_objects`)."""

    def __init__(self, payload: dict):
        self.payload, self.defend = payload, payload["defences"]
        self.device = torch.device(payload["device"])
        self.cuda = self.device.type == "cuda"
        if self.cuda:
            torch.cuda.set_device(self.device)
        self.times: dict[str, float] = {}
        torch.set_num_threads(payload["cpu_threads"])  # both models run on the same, fixed number of threads
        self.task = import_file(payload["task"], "reference_task")
        torch.manual_seed(payload["seed"])
        self.init_inputs = self.task.get_init_inputs()
        # Made now, before any candidate: its 256 MB are there for every call alike, checked or timed.
        self.flush = torch.empty(256 * 2**20 // 4, dtype=torch.int32, device=self.device) if self.cuda else None
        self.settings: ProcessSettings | None = None  # noted right before the candidate is imported
        self.kernel_log: KernelLog | None = None

    def rejected(self, rule_and_why: str) -> dict:
        return {"rejected": rule_and_why, "times": self.times}

    def make_inputs(self, seed: int) -> list:
        """Made on the device where the task does not say otherwise: a gigabyte of random numbers takes
        seconds on the host and milliseconds on a GPU."""
        torch.manual_seed(seed)
        with self.device:
            inputs = self.task.get_inputs()
        return [x.to(self.device) if isinstance(x, torch.Tensor) else x for x in inputs]

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()

    def poison(self) -> None:
        """Fill free device memory with NaN, so that output memory the candidate never writes is NaN."""
        if self.cuda and self.defend:
            free = torch.cuda.mem_get_info(self.device)[0]
            torch.empty(min(free // 2, self.payload["poison_bytes"]) // 4, device=self.device).fill_(float("nan"))

    def run_candidate(self, model, inputs: list, beside_ms: float = 0.0):
        """The candidate's output, its (possibly modified) arguments, and whether the output was still
        being written by work not ordered before the current stream when forward returned; with `beside_ms`,
        beside about that long of other work on the GPU (`busy_side_stream`)."""
        self.poison()
        args = clone(inputs) if self.defend else inputs
        busy = busy_side_stream(self.device, beside_ms) if self.cuda and beside_ms else None
        out = model(*args)
        if not self.defend:
            self.sync()
            return out, args, False
        early = probe(out)
        self.sync()  # device-wide: work left on a side stream finishes now
        del busy
        unsynchronized = any(not identical(a, b) for a, b in zip(early, probe(out)))
        return out, args, unsynchronized

    def reference_conditions_changed(self) -> str | None:
        """Why the reference would not run as it does in a clean process, if it would not: a process-wide
        setting (`ProcessSettings`) changed since the candidate was imported."""
        if self.settings is None or not (changed := self.settings.changed()):
            return None
        return f"[slowed-reference] the candidate changed a process-wide setting the reference runs under: {changed}"


class TamperCheck:
    """What the checks rely on, noted before the candidate is imported: the trusted objects, the number of
    threads (Python's and torch's) and the settings. `broken()` says what the candidate changed, if anything."""

    def __init__(self, payload: dict, judge):
        self.payload, self.defend, self.judge = payload, payload["defences"], judge
        self.trusted = trusted_objects(judge)
        self.threads = threading.active_count()
        self.torch_threads = torch.get_num_threads()
        self.settings = json.dumps(payload, sort_keys=True)

    def broken(self) -> str | None:
        if not self.defend:
            return None
        now = trusted_objects(self.judge)
        changed = [name for name, obj in self.trusted.items() if now.get(name) is not obj]
        if clocks := [name for name in changed if CLOCKS.search(name)]:
            return f"[clock-mismatch] the candidate replaced the timer's clock: {', '.join(clocks[:3])}"
        if changed or json.dumps(self.payload, sort_keys=True) != self.settings:
            return f"[patched-checker] the candidate replaced {', '.join(changed[:3]) or 'the settings'}"
        if threading.active_count() > self.threads:
            return "[threads] the candidate started a thread"
        if torch.get_num_threads() != self.torch_threads:
            return "[threads] the candidate changed the number of threads torch runs on"
        return None


def make_timer(run: RunChild):
    """timed(fn, args, label) -> (CUDA events' ms, the host's wall-clock ms, output): inside the kernel log's
    window named `label`, L2 flushed, then events around the call and the host's clock around the events and a
    device-wide synchronize, so that three clocks see each call; on the CPU the wall clock alone (reported
    twice). The flush is still running as the call is launched, as a busy GPU would be: the launch's latency
    is hidden behind it (about 20 µs a call on the H200, `bench/timer_protocols.py`), and the closing event
    waits for no round trip through the host (25 to 65 µs). Work on a side stream the current stream never
    waited for is outside the events; the kernel log counts it (`KernelLog.stop` gives where each call's GPU
    time began, evaluate.py's `on_every_stream` the span of its kernels from there)."""
    perf_counter = time.perf_counter
    if not run.cuda:
        def timed(fn, args: list, label: str) -> tuple[float, float, object]:
            begin = perf_counter()
            out = fn(*args)
            ms = (perf_counter() - begin) * 1e3
            return ms, ms, out
        return timed
    window = run.kernel_log.window if run.kernel_log else lambda label: contextlib.nullcontext()
    Event, synchronize = torch.cuda.Event, torch.cuda.synchronize

    def timed(fn, args: list, label: str) -> tuple[float, float, object]:
        synchronize()  # the inputs and their clones made: nothing from before runs into the window
        begin, end = Event(enable_timing=True), Event(enable_timing=True)
        with window(label):
            run.flush.zero_()  # evict the inputs and last results from L2: the window's first kernel
            wall = perf_counter()
            begin.record()
            out = fn(*args)
            end.record()
            synchronize()  # device-wide, inside the window: every kernel of the call, on any stream, is in it
            wall = perf_counter() - wall
        return begin.elapsed_time(end), wall * 1e3, out
    return timed
