"""What the checks stand on inside a run child: its state, the timer, the profiler and the tamper check.

evaluate.py's checks (correctness, the own-kernel share, timing) say what a candidate must do; this is how
they look: inputs made on the device, memory poisoned with NaN, outputs probed before a synchronize, fresh
inputs each trial, the timer (CUDA events after a device-wide synchronize, L2 flushed; the wall clock on
the CPU), the share of GPU time in the candidate's own kernels, and the identities of everything the checks
call, so that a candidate that replaces one is caught.
"""
from __future__ import annotations

import builtins
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
    Every method of torch.Tensor, every builtin, torch's and torch.cuda's functions, this module's own and
    RunChild's, and those of `judge`, the module whose checks call them."""
    owners = {"torch": torch, "torch.cuda": torch.cuda, "torch.cuda.Event": torch.cuda.Event,
              "torch.Tensor": torch.Tensor, "builtins": builtins, "time": time, "run_child": sys.modules[__name__],
              "run_child.RunChild": RunChild, "evaluate": judge}
    return {f"{label}.{name}": value for label, owner in owners.items() for name, value in vars(owner).items()
            if callable(value)}


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


def own_kernel_share(model, args: list, names: list[str]) -> tuple[float, list[str]] | None:
    """Share of the GPU time of one call spent in the candidate's own kernels, and the top other kernels;
    None where the profiler sees no computing kernel at all."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        model(*args)
        torch.cuda.synchronize()
    own = total = 0.0
    others: dict[str, float] = {}
    for event in prof.events():
        if event.device_type != DeviceType.CUDA or NEUTRAL_KERNEL.search(event.name):
            continue
        us = event.time_range.elapsed_us()
        total += us
        if is_own_kernel(event.name, names):
            own += us
        else:
            others[event.name[:60]] = others.get(event.name[:60], 0.0) + us
    if total == 0:
        return None
    return own / total, sorted(others, key=others.get, reverse=True)[:3]


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

    def run_candidate(self, model, inputs: list, busy_ms: float = 0.0):
        """The candidate's output, its (possibly modified) arguments, and whether the output was still
        being written by work not ordered before the current stream when forward returned; with `busy_ms`,
        beside about that long of other work on the GPU (`busy_side_stream`)."""
        self.poison()
        args = clone(inputs) if self.defend else inputs
        busy = busy_side_stream(self.device, busy_ms) if self.cuda and busy_ms else None
        out = model(*args)
        if not self.defend:
            self.sync()
            return out, args, False
        early = probe(out)
        self.sync()  # device-wide: work left on a side stream finishes now
        del busy
        unsynchronized = any(not identical(a, b) for a, b in zip(early, probe(out)))
        return out, args, unsynchronized

    def fresh(self, inputs: list) -> list:
        """A new buffer with slightly new values every trial: nothing can be cached by pointer or content."""
        if not self.defend:
            return inputs
        return [x * (1 + 1e-3 * (torch.rand_like(x) - 0.5)) if isinstance(x, torch.Tensor) and x.is_floating_point()
                else x.clone() if isinstance(x, torch.Tensor) else x for x in inputs]


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
        if changed or json.dumps(self.payload, sort_keys=True) != self.settings:
            return f"[patched-checker] the candidate replaced {', '.join(changed[:3]) or 'the settings'}"
        if threading.active_count() > self.threads:
            return "[threads] the candidate started a thread"
        if torch.get_num_threads() != self.torch_threads:
            return "[threads] the candidate changed the number of threads torch runs on"
        return None


def make_timer(run: RunChild):
    """fn(*args) timed in ms: CUDA events around it, closed after a device-wide synchronize (work left on side
    streams counts) with L2 flushed first; on the CPU, the wall clock."""
    if not run.cuda:
        def timed(fn, args: list) -> tuple[float, object]:
            begin = time.perf_counter()
            out = fn(*args)
            return (time.perf_counter() - begin) * 1e3, out
        return timed
    flush = torch.empty(256 * 2**20 // 4, dtype=torch.int32, device=run.device)

    def timed(fn, args: list) -> tuple[float, object]:
        flush.zero_()  # evict the inputs and last results from L2
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        out = fn(*args)
        torch.cuda.synchronize()  # device-wide: work left on side streams is counted
        end.record()
        end.synchronize()
        return begin.elapsed_time(end), out
    return timed
