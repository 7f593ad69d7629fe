"""The runner: the process that imports the candidate and runs it, and nothing else of the verdict.

It is the judge's (judge.py) hands in a process the candidate owns: it takes the judge's inputs from their
shared memory (tensor_exchange.py), calls ModelNew, and puts the outputs back there; it decides nothing, holds
no reference output and draws no random number. What it reports of itself (its calls' times, the kernels its
profiler saw, that an output is not a view of an input) is what a candidate that rewrites this process could
fake; the judge checks those reports against what it observes from outside (judge.py says how).

What it keeps as a line of defence inside the candidate's process: memory poisoned with NaN before each
checked call, outputs copied on the current stream as forward returns and compared after a synchronize (work
left on a side stream), outputs refused that share memory with an input or wrap memory torch's allocator never
handed out, the timer (harness.py: L2 flushed, CUDA events around the call, the host's wall clock around them
and a device-wide synchronize; the wall clock alone on the CPU), the kernel log (harness.py: torch's profiler on
from before the candidate is imported to the last call, its GPU side off in the calls whose time is reported),
and the identities of everything the timer calls (`TamperCheck`).
"""
from __future__ import annotations

import bisect
import builtins
import collections
import importlib
import itertools
import json
import multiprocessing.connection
import re
import sys
import threading
import time
import traceback

import torch

from kevin import harness
from kevin.harness import (KernelLog, flatten_outputs, flush_buffer, identical, import_file, make_timer,
                           peak_resident_bytes, start_task, wait_awake)
from kevin.tensor_exchange import Arena


def trusted_objects() -> dict:
    """Everything the check and the timing call, by identity: a candidate that replaces one is rejected.
    Every method of torch.Tensor, every builtin, torch's and torch.cuda's functions, torch._C's functions and
    the methods and descriptors of its C-level types (TensorBase, _CudaEventBase, whose elapsed_time
    torch.cuda.Event calls, ...) and of torch.cuda's classes, which native code can replace without touching
    a Python-level object, and this module's own, the harness's and the Runner's; and what the GPU's numbers pass
    through on their way to the judge: the kernel log's profiler and its events, the JSON encoder, the socket's
    methods."""
    from torch.autograd import profiler, profiler_util

    owners = {"torch": torch, "torch.cuda": torch.cuda, "torch.Tensor": torch.Tensor, "torch._C": torch._C,
              "builtins": builtins, "time": time, "runner": sys.modules[__name__], "runner.Runner": Runner,
              "harness": harness, "harness.KernelLog": KernelLog, "bisect": bisect, "json": json,
              "json.encoder": json.encoder, "json.decoder": json.decoder, "json.JSONEncoder": json.JSONEncoder,
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


def trim_heap() -> None:
    """The heap's free pages given back after a checked call (untimed): each output there is allocated aligned, which
    a block freed by the call before cannot always serve, so that without this every checked call on the CPU grew the
    resident peak by one output (six outputs of 256 MB past the draw's own, measured on a ReLU)."""
    import ctypes

    ctypes.CDLL(None).malloc_trim(0)


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
        self.arena = self.model = self.tamper = None
        self.null_outputs: list[torch.Tensor] = []  # made once the arena's layout is known (on a GPU, until the import)
        self.memory_limit: int | None = None  # bytes this process may hold, on a GPU
        self.labels: set[str] = set()
        self.awake = payload.get("spin_waits", False)  # on a core of its own: the judge's requests waited for awake

    def serve(self) -> dict:
        """Answer the judge until it says finish; an exception of the candidate's is an answer too."""
        handlers = {"arena": self.take_arena, "import": self.import_candidate, "call": self.call,
                    "go": self.go, "log": self.log,
                    "copy_parameters": self.copy_parameters, "finish": self.finish}
        with torch.no_grad():
            while True:
                if self.awake:
                    wait_awake(self.judge)
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
        if self.cuda:  # its memory is the candidate's from here; on the CPU the judge times the harness throughout
            self.null_outputs = []
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
        """A timed call, and its outputs handed over, in one request: the judge's clocks run from before it writes
        the inputs to this answer. Every call hands its outputs over, and the judge reads some (the spot checks): a
        call cannot tell whether it is checked, so work put off until its outputs are read is done in every call,
        inside the judge's clocks. With `null`, the call is of no model at all: what the harness alone costs,
        handing over included, asked before the candidate is imported (and on the CPU between its calls too; its
        outputs made once, ahead: making an output is the model's work, and the reference's)."""
        args = self.arguments(message)
        model = (lambda *a: self.null_outputs) if message.get("null") else self.model
        held = input_spans(args)
        self.labels.add(message["label"])
        events, wall, out = self.timer(model, args, message["label"])
        return {"events": events, "wall": wall, **self.put_outputs(out, held)}

    def log(self, message: dict) -> dict:
        """The kernel log's GPU side on or off, asked between timed calls (the judge's clock of a call excludes it)."""
        if self.kernel_log:
            self.kernel_log.record(bool(message["on"]))
        return {}

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
