"""The runner: the process that imports the candidate and runs it, and nothing else of the verdict.

It is the judge's (judge.py) hands in a process the candidate owns: it takes the judge's inputs from their
shared memory (tensor_exchange.py), calls ModelNew, and puts the outputs back there; it decides nothing, holds
no reference output and draws no random number. What it reports of itself (its calls' times, the kernels its
profiler saw, that an output is not a view of an input) is what a candidate that rewrites this process could
fake; the judge checks those reports against what it observes from outside (judge.py says how).

What it keeps as a line of defence inside the candidate's process: memory poisoned with NaN before each
checked call, outputs copied on the current stream as forward returns and compared after a synchronize (work
left on a side stream), outputs refused that share memory with an input or wrap memory torch's allocator never
handed out, the timer (L2 flushed, CUDA
events around the call, the host's wall clock around them and a device-wide synchronize; the wall clock alone
on the CPU), the kernel log (torch's profiler on from before the candidate is imported to the last call, its GPU
side off in the calls whose time is reported), and the identities of everything the timer calls (`TamperCheck`).
"""
from __future__ import annotations

import bisect
import builtins
import collections
import contextlib
import importlib
import importlib.util
import itertools
import json
import multiprocessing.connection
import re
import resource
import sys
import threading
import time
import traceback

import torch

from kevin.tensor_exchange import Arena


def import_file(path: str, name: str):
    """Execute a source file as a module (a task, or a candidate) without touching sys.modules."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def build_candidate(payload: dict) -> dict:
    """The build child's job: import the candidate, whose load_inline has the evaluator build its extensions (or
    finds them built)."""
    start = time.perf_counter()
    import_file(payload["candidate"], "candidate")
    return {"seconds": time.perf_counter() - start}


def flatten_outputs(out) -> list:
    """A model's output as a list of outputs: a tuple or list as it is, anything else alone."""
    return list(out) if isinstance(out, (tuple, list)) else [out]


def identical(a, b) -> bool:
    """Bitwise equal, NaN included."""
    return torch.equal(a, b) or (a.is_floating_point() and a.shape == b.shape
                                 and torch.allclose(a, b, rtol=0, atol=0, equal_nan=True))


def trusted_objects() -> dict:
    """Everything the check and the timing call, by identity: a candidate that replaces one is rejected.
    Every method of torch.Tensor, every builtin, torch's and torch.cuda's functions, torch._C's functions and
    the methods and descriptors of its C-level types (TensorBase, _CudaEventBase, whose elapsed_time
    torch.cuda.Event calls, ...) and of torch.cuda's classes, which native code can replace without touching
    a Python-level object, and this module's own and the Runner's; and what the GPU's numbers pass through on
    their way to the judge: the kernel log's profiler and its events, the JSON encoder, the socket's methods."""
    from torch.autograd import profiler, profiler_util

    owners = {"torch": torch, "torch.cuda": torch.cuda, "torch.Tensor": torch.Tensor, "torch._C": torch._C,
              "builtins": builtins, "time": time, "run_child": sys.modules[__name__], "run_child.Runner": Runner,
              "run_child.KernelLog": KernelLog, "bisect": bisect, "json": json, "json.encoder": json.encoder,
              "json.decoder": json.decoder, "json.JSONEncoder": json.JSONEncoder,
              "json.JSONDecoder": json.JSONDecoder, "Connection": multiprocessing.connection.Connection,
              "torch.profiler": torch.profiler, "torch.profiler.profile": torch.profiler.profile,
              "torch.profiler._KinetoProfile": torch.profiler.profiler._KinetoProfile,
              "torch.autograd.profiler": profiler, "torch.autograd.profiler.profile": profiler.profile,
              "torch.autograd.profiler.record_function": profiler.record_function,
              "EventList": profiler_util.EventList, "FunctionEvent": profiler_util.FunctionEvent,
              "Interval": profiler_util.Interval}
    for label, module in (("torch._C", torch._C), ("torch.cuda", torch.cuda)):
        owners.update({f"{label}.{name}": t for name, t in vars(module).items() if isinstance(t, type)})
    return {f"{label}.{name}": value for label, owner in owners.items() for name, value in vars(owner).items()
            if callable(value) or hasattr(type(value), "__get__")}


# The clock the timer reads, torch.cuda.Event, is a C-level type underneath, immutable from Python: a
# replaced method of it is native code faking the clock. Python-level timers and synchronize replaced are
# a patched checker like any other trusted object.
CLOCKS = re.compile(r"^torch\._C\._CudaEventBase\.")


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


class TamperCheck:
    """What the checks rely on, noted before the candidate is imported: the trusted objects, the number of
    threads (Python's and torch's) and the settings. `broken()` says what the candidate changed, if anything."""

    def __init__(self, payload: dict):
        self.payload, self.defend = payload, payload["defences"]
        self.trusted = trusted_objects()
        self.threads = threading.active_count()
        self.torch_threads = torch.get_num_threads()
        self.settings = json.dumps(payload, sort_keys=True)

    def broken(self) -> str | None:
        if not self.defend:
            return None
        now = trusted_objects()
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


def copy_parameters(source, target) -> int:
    """Copy source's parameters and buffers into target's where a shape occurs once on each side; how many."""
    def by_shape(module) -> dict[tuple, list[torch.Tensor]]:
        groups = collections.defaultdict(list)
        for tensor in itertools.chain(module.parameters(), module.buffers()):
            groups[tuple(tensor.shape)].append(tensor)
        return groups
    theirs, ours = by_shape(source), by_shape(target)
    pairs = [(theirs[shape][0], mine[0]) for shape, mine in ours.items() if len(mine) == 1 and len(theirs[shape]) == 1]
    with torch.no_grad():
        for value, tensor in pairs:
            tensor.copy_(value)
    return len(pairs)


def make_timer(cuda: bool, flush: torch.Tensor | None, kernel_log: KernelLog | None):
    """timed(fn, args, label) -> (CUDA events' ms, the host's wall-clock ms, output): inside the kernel log's
    window named `label`, L2 flushed, then events around the call and the host's clock around the events and a
    device-wide synchronize, so that three clocks see each call; on the CPU the wall clock alone (reported
    twice). The flush is still running as the call is launched, as a busy GPU would be: the launch's latency
    is hidden behind it (about 20 µs a call on the H200, `bench/timer_protocols.py`), and the closing event
    waits for no round trip through the host (25 to 65 µs). Work on a side stream the current stream never
    waited for is outside the events; the kernel log counts it in the logged calls (judge.py's `log_dodging`)."""
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


def trim_heap() -> None:
    """The heap's free pages given back after a checked call (untimed): each output there is allocated aligned, which
    a block freed by the call before cannot always serve, so that without this every checked call on the CPU grew the
    resident peak by one output (six outputs of 256 MB past the draw's own, measured on a ReLU)."""
    import ctypes

    ctypes.CDLL(None).malloc_trim(0)


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


def _span(tensor: torch.Tensor) -> tuple[int, int]:
    storage = tensor.untyped_storage()
    return storage.data_ptr(), storage.data_ptr() + storage.nbytes()


def input_spans(args: list) -> list[tuple[int, int]]:
    """The memory of a call's tensor inputs, which no output may share: read off the harness's own tensors (the
    shared block's slots), calling nothing of the candidate's between the inputs' arrival and the call."""
    return [_span(a) for a in args if isinstance(a, torch.Tensor)]


def as_returned(out) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(output, a copy of it made on the current stream as forward returned) for each plain tensor output: a kernel
    still writing it on a stream the current one does not wait for leaves the copy with what was there before
    (poison: NaN), and the two differ once the device is synchronised. GPU outputs only: on the CPU nothing stands
    between forward's return and the copy to the judge, so a thread still writing spoils that copy itself."""
    return [(o, o.clone()) for o in flatten_outputs(out)
            if type(o) is torch.Tensor and o.layout == torch.strided and o.device.type == "cuda"]


class Runner:
    """The candidate's process, driven by the judge: one request, one answer, over their socket (JSON)."""

    def __init__(self, payload: dict, judge):
        self.payload, self.judge, self.defend = payload, judge, payload["defences"]
        self.device, self.task, self.init_inputs = start_task(payload)
        self.cuda = self.device.type == "cuda"
        importlib.import_module("torch._dynamo")  # what torch imports lazily (and patches) predates the snapshot
        self.flush = flush_buffer(self.device)  # made now, before any candidate: there for every call alike
        self.kernel_log = KernelLog() if self.cuda and self.defend else None
        self.timer = make_timer(self.cuda, self.flush, self.kernel_log)
        self.arena = self.model = self.tamper = self.pending = None
        self.null_outputs: list[torch.Tensor] = []  # made once the arena's layout is known, until the import
        self.memory_limit: int | None = None  # bytes this process may hold, on a GPU
        self.labels: set[str] = set()

    def serve(self) -> dict:
        """Answer the judge until it says finish; an exception of the candidate's is an answer too."""
        handlers = {"arena": self.take_arena, "import": self.import_candidate, "call": self.call,
                    "go": self.go, "collect": self.collect, "log": self.log,
                    "copy_parameters": self.copy_parameters, "finish": self.finish}
        with torch.no_grad():
            while True:
                message = json.loads(self.judge.recv_bytes())
                try:
                    answer = handlers[message["op"]](message)
                except Exception as e:  # noqa: BLE001 - the candidate's own failure, reported as such
                    answer = {"error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc(),
                              "stage": "init" if message["op"] == "import" else "candidate"}
                self.judge.send_bytes(json.dumps({**answer, "number": message.get("number")}, default=str).encode())
                if message["op"] == "finish":
                    return {}

    def take_arena(self, message: dict) -> dict:
        """The shared block mapped, and on a GPU the cap on what this process may allocate from here on (the judge
        admitted the candidate for that much: beyond it, an out-of-memory error here, not in another process)."""
        self.arena = Arena.receive(self.judge, message)
        if self.cuda and message.get("memory_limit"):
            self.memory_limit = torch.cuda.memory_reserved(self.device) + int(message["memory_limit"])
            total = torch.cuda.mem_get_info(self.device)[1]
            torch.cuda.set_per_process_memory_fraction(min(1.0, self.memory_limit / total), self.device)
        self.null_outputs = [torch.empty(s.shape, dtype=s.dtype, device=self.device) for s in self.arena.outputs
                             if s is not None]
        return {}

    def arguments(self, message: dict) -> list:
        """The call's inputs as the judge wrote them into their slots just before asking, and the values it sent
        for those that are not tensors: nothing is drawn here, so nothing here knows an input before the call."""
        return [value if slot is None else slot for slot, value in zip(self.arena.inputs, message["values"])]

    def import_candidate(self, message: dict) -> dict:
        """The candidate imported and ModelNew built under the task's seed, the tamper check's snapshot first."""
        self.tamper = TamperCheck(self.payload)
        self.null_outputs = []  # the calls of no model are over
        candidate = import_file(self.payload["candidate"], "candidate")
        torch.manual_seed(self.payload["seed"])
        self.model = candidate.ModelNew(*self.init_inputs).to(self.device).eval()
        if self.payload["copy_parameters"]:
            self.copy_parameters({})
        return {}

    def copy_parameters(self, message: dict) -> dict:
        """The reference's parameters (built here as the judge builds it) copied into ModelNew: how many."""
        torch.manual_seed(self.payload["seed"])
        return {"copied": copy_parameters(self.task.Model(*self.init_inputs).to(self.device), self.model)}

    def poison(self) -> None:
        """Fill the memory the call will allocate with NaN, so that output memory the candidate never writes is NaN:
        the allocator's cache emptied first (a block an earlier call left there, never poisoned, would be the one an
        output of its size gets: a ReLU's unwritten half read as zeros on the H200), then three quarters of the room
        left under this process's cap (a quarter for new small blocks: were the cap reached, the allocator would
        free the poisoned block to make one), within half the GPU's free memory and `poison_bytes`."""
        if self.cuda and self.defend:
            torch.cuda.empty_cache()
            size = min(torch.cuda.mem_get_info(self.device)[0] // 2, self.payload["poison_bytes"])
            if self.memory_limit:
                size = min(size, (self.memory_limit - torch.cuda.memory_reserved(self.device)) * 3 // 4)
            torch.empty(max(0, size) // 4, device=self.device).fill_(float("nan"))

    def call(self, message: dict) -> dict:
        """A checked call: into poisoned memory, with `beside_ms` of other work on the GPU (a race lands
        elsewhere), each output copied on the current stream as forward returns (what its caller would read) and
        compared with itself after a device-wide synchronize, then copied to the judge."""
        self.poison()
        args = self.arguments(message)
        beside = busy_side_stream(self.device, message.get("beside_ms", 0.0)) \
            if self.cuda and message.get("beside_ms") else None
        held = input_spans(args)
        out = self.model(*args)
        early = as_returned(out) if self.defend else []
        if self.cuda:
            torch.cuda.synchronize()
        del beside
        answer = self.put_outputs(out, held)
        answer["unsynchronized"] = any(not identical(a, b) for a, b in early)
        del out, early
        if not self.cuda:
            trim_heap()
        return answer

    def go(self, message: dict) -> dict:
        """A timed call, in two requests, so that the judge reads this process's clocks (its CPU time) while it
        waits on each: `go` makes the call and answers as it returns, `collect` checks its outputs and hands them
        over. Every call hands them over, and the judge reads some (the spot checks): a call cannot tell whether
        it is checked, so work put off until its outputs are read is done in every call, inside the judge's
        clocks. With `null`, the call is of no model at all: what the harness alone costs, handing over included,
        asked before the candidate is imported (its outputs made once, ahead: making an output is the model's
        work, and the reference's)."""
        args = self.arguments(message)
        model = (lambda *a: self.null_outputs) if message.get("null") else self.model
        held = input_spans(args)
        self.labels.add(message["label"])
        events, wall, out = self.timer(model, args, message["label"])
        self.pending = {"out": out, "held": held}
        return {"events": events, "wall": wall}

    def log(self, message: dict) -> dict:
        """The kernel log's GPU side on or off, asked between timed calls (the judge's clock of a call excludes it)."""
        if self.kernel_log:
            self.kernel_log.record(bool(message["on"]))
        return {}

    def collect(self, message: dict) -> dict:
        pending, self.pending = self.pending, None
        return self.put_outputs(pending["out"], pending["held"])

    def put_outputs(self, out, inputs: list[tuple[int, int]]) -> dict:
        """Each output's shape and dtype (what else it is, if not a plain dense tensor on this device), copied into
        the judge's slot where it has the slot's shape and dtype (in the judge's clocks: making a strided output
        dense is the call's cost); an output sharing memory with an input (`inputs`: their spans) or in memory
        torch's allocator never handed out is refused. An output the candidate keeps and writes again on every call
        is its own affair: the judge reads a copy taken as the call returned."""
        outputs = flatten_outputs(out)
        described = []
        for i, o in enumerate(outputs):
            if not isinstance(o, torch.Tensor):
                described.append({"type": type(o).__name__})
                continue
            if type(o) is not torch.Tensor or o.layout != torch.strided:
                described.append({"not_plain": f"a {type(o).__name__} ({o.layout})"})
                continue
            if o.device != self.device:
                described.append({"not_plain": f"on {o.device}, not {self.device}"})
                continue
            if o.numel() and o.untyped_storage().data_ptr() == 0:
                described.append({"not_plain": "a tensor with no storage"})
                continue
            begin, end = _span(o) if o.numel() else (0, 0)
            where = f"output {i} " if len(outputs) > 1 else "the output "
            if o.numel() and any(begin < e and b < end for b, e in inputs):
                return {"rejected": f"[output-alias] {where}shares memory with an input: return a tensor that your "
                                    "kernel writes"}
            if o.numel() and not o.untyped_storage().resizable():
                return {"rejected": f"[output-alias] {where}wraps memory that torch's allocator did not hand out "
                                    "(from_blob): the judge cannot tell it from an input mapped at a second address; "
                                    "allocate outputs with torch (torch::empty, or a buffer made once in __init__)"}
            dtype = str(o.dtype).removeprefix("torch.")
            slot = self.arena.outputs[i] if i < len(self.arena.outputs) else None
            if slot is not None and list(slot.shape) == list(o.shape) and slot.dtype == o.dtype:
                slot.copy_(o)
            described.append({"shape": list(o.shape), "dtype": dtype})
        if self.cuda:  # in the slots before the answer: the judge reads them as it comes
            torch.cuda.synchronize()
        return {"outputs": described}

    def finish(self, message: dict) -> dict:
        """The kernel log of every call (label -> its kernels, and where its GPU time began) and whether the timer's
        objects are still the ones it started with."""
        log = self.kernel_log.stop(self.labels) if self.kernel_log else {}
        peak = torch.cuda.max_memory_reserved(self.device) if self.cuda else peak_resident_bytes()
        return {**log, "tamper": self.tamper.broken() if self.tamper else None, "peak_memory": peak}


def run(payload: dict, judge) -> dict:
    """The run child's job: serve the judge, whose socket is `judge`; its answer to the evaluator says nothing."""
    Runner(payload, judge).serve()
    return {}
