"""Compile, check and time candidate kernels against a task's PyTorch reference.

A candidate is a Python module defining `ModelNew` whose work is done by native code it builds with
`torch.utils.cpp_extension.load_inline` (CUDA on a GPU; C++ with `--device cpu`, so the whole pipeline
also runs where no GPU exists). Each candidate gets a status, a speedup and the feedback text the model
reads on its next turn (the five kinds of the Kevin paper, plus `rejected` and `timeout`).

Pipeline, per call of `evaluate(records)`:
  1. parse: the last fenced code block of a reply (or the record's code as is); the static rules of --rules,
     the paper's (no try/except, no `pass`, no torch.nn layers / functional / torch compute ops, a native
     kernel) or KernelBench's (the same, but PyTorch ops and torch.nn layers allowed).
  2. build: every distinct candidate is imported in a child process from a pool sized to the cores, with
     load_inline redirected to a content-addressed build cache of light, precompiled torch headers, so that
     an extension repeated across a GRPO group or a later turn is compiled once and fast (build_cache.py).
  3. run: per GPU, one fresh child process per candidate, set up (CUDA context and all) while the ones
     before it run: correctness on `--correct-trials` fresh random input sets (candidate first, then the
     reference, each on its own clone of the inputs; shape, dtype, NaN/Inf and tolerance checks), the
     share of GPU time in the candidate's own kernels, then candidate and reference timed alternately in
     the same process (warm-up, L2 flush before each trial, CUDA events closed after a device-wide
     synchronize, median, floored at the timer's resolution so that a speedup is always finite).
  A crash, illegal memory access, `sys.exit` or hang kills only that child; the result says so (isolation.py).

The file reads in that order: config, tasks, the checking inside the run child (`check_correctness`,
`check_own_kernel_share`, `time_models`, composed by `_run`), feedback, the scheduler (`_Evaluation`), the
command line. Its machinery lives in helper modules named for what they do: static_rules.py (parsing and
the static rules), run_child.py (what the checks stand on: poison, probes, the timer, the profiler, the
tamper check), eval_children.py (the children's settings and what their output comes down to),
eval_records.py (the JSONL in and out, and what a resumed run goes on from), config_flags.py (one flag per
EvalConfig field), build_cache.py and isolation.py; none imports this one.

Defaults follow the KernelBench version Kevin used (atol = rtol = 1e-2, seed 42 before building each
model so parameters made the same way match); where the paper is silent (number of correctness inputs,
timing protocol, how far repeated runs may differ) the choices are flags documented in the README.
`--rules kernelbench` judges as KernelBench does instead (its tolerances per dtype; PyTorch allowed for what
the candidate does not replace), with every runtime defence kept.

Usage:
  python evaluate.py IN.jsonl > OUT.jsonl        # records with `task` and `code`; `-` reads stdin
  python evaluate.py IN.jsonl -o OUT.jsonl       # appends as results finish; a re-run resumes
  python evaluate.py                              # the hand-written kernels in solutions/, GPU if any
"""
from __future__ import annotations

import argparse
import collections
import itertools
import json
import math
import os
import queue
import random
import re
import shutil
import signal
import sys
import tempfile
import threading
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from dependencies import require

require("torch")

import torch

import sandbox
from build_cache import BuildCache, compile_extension
from config_flags import add_config_flags, given_flags
from eval_children import child_settings, first_lines, last_frames, sandbox_mechanisms, trim_compiler_output
from eval_records import already_written, library_records, read_records
from isolation import (finish_child, hidden_from_children, run_in_child, start_child, start_fork_server,
                       stop_child_later, stop_every_child)
from run_child import (NEUTRAL_KERNEL, KernelLog, ProcessSettings, RunChild, TamperCheck, busy_ms, changed, clone,
                       flatten_outputs, identical, import_file, is_own_kernel, make_timer, span_ms)
from static_rules import (FENCE, RULES, extract_code, kernel_names, rejection,  # noqa: F401 (FENCE: generate.py's)
                          static_check)

ROOT = Path(__file__).resolve().parent
STATUSES = ("format_error", "rejected", "compile_error", "runtime_error", "timeout", "incorrect", "correct")


@dataclass
class EvalConfig:
    device: str = "auto"
    """'cuda' (CUDA candidates, one worker per GPU), 'cpu' (C++ candidates) or 'auto' (cuda if visible)"""
    gpus: list[int] | None = None
    """GPU indices to spread candidates over, comma-separated on the command line (default: every visible GPU)"""
    tasks: str = str(ROOT / "tasks")
    """task folder (or KernelBench level folder) that task ids are resolved against; the CPU demo (no input)
    takes the CPU-sized copies in tests/tasks/"""
    correct_trials: int = 5
    """fresh random input sets the candidate must match the reference on"""
    atol: float | None = None
    """absolute tolerance, for every dtype (default: the rules' own; kevin: 1e-2, the KernelBench version Kevin
    used; kernelbench: KernelBench's per dtype, 1e-4 for fp32 and 1e-2 for fp16/bf16)"""
    rtol: float | None = None
    """relative tolerance, for every dtype (default: the rules' own, as for --atol)"""
    timing_trials: int = 100
    """timed runs per model (fewer if --timing-budget-s runs out first, never fewer than 10)"""
    timing_budget_s: float = 10.0
    """wall-clock budget for the timed runs of one candidate and its reference together"""
    warmup: int = 3
    """untimed runs per model before timing"""
    compile_baseline: bool = False
    """also time torch.compile(Model) and report speedup_vs_compile"""
    min_own_kernel_share: float = 0.8
    """least share of the forward's GPU time (fills and copies aside) in the candidate's own __global__
    kernels, profiled; 0 turns the check off"""
    poison_bytes: int = 2 << 30
    """free device memory filled with NaN before each correctness run (at most half of what is free)"""
    defences: bool = True
    """every runtime defence (poison, clones, second run, probes, profiler, fresh timing inputs, spot checks,
    tamper checks); turning them off (--no-defences) is only to measure what they cost (bench/defence_cost.py)"""
    cpu_threads: int = 1
    """torch's intra-op threads in the checking child, for the reference and the candidate alike (at::parallel_for
    draws on the same pool): fixed, so that a CPU speedup does not hang on how many cores happen to be free; 1
    is the count that other work on the machine disturbs least"""
    seed: int = 42
    """seed set before get_init_inputs and before building each model (KernelBench's convention)"""
    compile_workers: int = len(os.sched_getaffinity(0))
    """candidates built at once"""
    spare_children: int = 3
    """checking children started ahead on each GPU, no more than there are candidates left: each sets itself up
    (CUDA context, torch._dynamo: seconds) while the candidates before it run (about a second each once built)"""
    compile_timeout_s: float = 900.0
    """wall-clock limit for building one candidate"""
    run_timeout_s: float = 180.0
    """wall-clock limit for checking and timing one candidate (KernelBench's batch scripts: 180 s)"""
    build_dir: str = str(ROOT / ".cache" / "builds")
    """where extensions are built, one folder per distinct extension (kept: a cache across runs)"""
    sandbox: str = "auto"
    """box in the children that run candidate code (sandbox.py): 'auto' applies what the kernel offers and
    says which, 'strict' refuses to run without all of it, 'off' runs candidates with the user's full rights"""
    progress: bool = True
    """a tqdm progress bar on stderr (--no-progress: none)"""
    max_copy_share: float = 0.1
    """share of the candidate's GPU time that copies and fills may take as neutral work (an output zeroed for
    atomics, a .contiguous()); beyond it they count as library work in the own-kernel share"""
    max_reference_slowdown: float = 1.3
    """how much slower (fastest call against fastest call, and on a GPU its kernels' time against theirs, plus
    5 µs) the reference may run in the candidate's process than in a clean one that never imports candidate
    code, timed once per task and device; beyond it the candidate slowed the reference and is rejected"""
    rules: str = "kevin"
    """which rules judge: 'kevin' (the paper's: no torch.nn layers, torch.nn.functional or torch compute ops; your
    own kernels do --min-own-kernel-share of the GPU work) or 'kernelbench' (KernelBench's: PyTorch ops and torch.nn
    layers allowed for what you do not replace, but your kernels must run; its tolerances per dtype); both ban
    try/except, `pass`, threads and introspection, and keep every runtime defence"""
    repeat_runs: int = 3
    """extra runs on the first input set that must agree with the candidate's first run there, the last beside a
    busy kernel on another stream (on a GPU), so that a race lands differently"""
    repeat_tolerance: float = 1e-5
    """largest difference allowed between those runs, relative to the output's largest magnitude (at least 4
    epsilons of its dtype): a deterministic kernel repeats every bit, fp32 atomics differ by ~1e-7 of it, a race
    in a tiled GEMM by ~1e-2"""
    copy_parameters: bool = False
    """copy the reference's parameters and buffers into ModelNew (where a shape occurs once on each side) before
    judging: the kernel judged apart from how ModelNew initialised its weights"""

    def __post_init__(self):
        """Every value checked once, here: a trial count of 0 would skip the check it counts (a wrong kernel
        "correct") or leave nothing to time; the first bad value is the error."""
        rules = [("device", "cuda, cpu or auto", self.device in ("cuda", "cpu", "auto")),
                 ("gpus", "a non-empty list of GPU indices", self.gpus is None or (
                     bool(self.gpus) and all(isinstance(g, int) and g >= 0 for g in self.gpus))),
                 ("correct_trials", "at least 1", self.correct_trials >= 1),
                 ("atol", "at least 0", self.atol is None or self.atol >= 0),
                 ("rtol", "at least 0", self.rtol is None or self.rtol >= 0),
                 ("timing_trials", "at least 1", self.timing_trials >= 1),
                 ("timing_budget_s", "at least 0", self.timing_budget_s >= 0),
                 ("warmup", "at least 0", self.warmup >= 0),
                 ("cpu_threads", "at least 1", self.cpu_threads >= 1),
                 ("min_own_kernel_share", "between 0 and 1", 0 <= self.min_own_kernel_share <= 1),
                 ("poison_bytes", "at least 0", self.poison_bytes >= 0),
                 ("compile_workers", "at least 1", self.compile_workers >= 1),
                 ("spare_children", "at least 0", self.spare_children >= 0),
                 ("compile_timeout_s", "more than 0", self.compile_timeout_s > 0),
                 ("run_timeout_s", "more than 0", self.run_timeout_s > 0),
                 ("sandbox", "off, auto or strict", self.sandbox in ("off", "auto", "strict")),
                 ("max_copy_share", "between 0 and 1", 0 <= self.max_copy_share <= 1),
                 ("max_reference_slowdown", "at least 1", self.max_reference_slowdown >= 1),
                 ("rules", "kevin or kernelbench", self.rules in RULES),
                 ("repeat_runs", "at least 1", self.repeat_runs >= 1),
                 ("repeat_tolerance", "at least 0", self.repeat_tolerance >= 0)]
        for name, rule, ok in rules:
            if not ok:
                raise ValueError(f"{name} (--{name.replace('_', '-')}) must be {rule}, not {getattr(self, name)!r}")


# ----------------------------------------------------------------------------------------------------
# Tasks

def load_tasks(path: str | Path) -> dict[str, Path]:
    """Task id -> file for a task file, a folder of them, or a KernelBench level folder, unchanged.

    Ids are `<parent folder>/<file stem>` (e.g. `level1/19_ReLU`), stable wherever the folder lives."""
    path = Path(path)
    if path.is_file():
        files = [path]
    elif path.is_dir():
        files = sorted(p for p in path.rglob("*.py") if not p.name.startswith(("_", ".")))
    else:
        raise SystemExit(f"error: no task file or folder at {path}")
    tasks = {}
    for f in files:
        text = f.read_text(errors="replace")
        if "class Model" in text and "def get_inputs" in text:
            tasks[f"{f.parent.name}/{f.stem}"] = f.resolve()
    return tasks


def resolve_task(task: str, index: dict[str, Path]) -> Path:
    if task in index:
        return index[task]
    if Path(task).is_file():
        return Path(task).resolve()
    raise ValueError(f"unknown task {task!r}: neither a task id under the task folder nor a file")


# ----------------------------------------------------------------------------------------------------
# The build child's job (run in isolation.py's children; the run child's job, `_run`, follows the checks;
# the static rules before both are in static_rules.py)


def _build(payload: dict) -> dict:
    """Import the candidate, whose load_inline has the evaluator build its extensions (or finds them built)."""
    start = time.perf_counter()
    import_file(payload["candidate"], "candidate")
    return {"seconds": time.perf_counter() - start}


# ----------------------------------------------------------------------------------------------------
# The check and the timing, inside the run child (what they stand on: run_child.py)


# KernelBench's own tolerances (atol = rtol) per output dtype, in its versions after the one Kevin used (1e-2 for
# all); other dtypes get fp32's.
KERNELBENCH_TOLERANCE = {"float32": 1e-4, "float16": 1e-2, "bfloat16": 1e-2}
KEVIN_TOLERANCE = 1e-2


def tolerances(cfg: EvalConfig) -> dict[str, list[float]]:
    """[atol, rtol] per output dtype ('other': the rest): the flags where given, else the rules' defaults."""
    def default(dtype: str) -> float:
        return KERNELBENCH_TOLERANCE.get(dtype, KERNELBENCH_TOLERANCE["float32"]) if cfg.rules == "kernelbench" \
            else KEVIN_TOLERANCE
    return {dtype: [default(dtype) if cfg.atol is None else cfg.atol, default(dtype) if cfg.rtol is None else cfg.rtol]
            for dtype in (*KERNELBENCH_TOLERANCE, "other")}


def _compare(candidate, reference, tolerance: dict[str, list[float]]) -> tuple[str | None, str | None, float, float]:
    """(status, why, max |difference|, max |difference| / |reference|) for one trial's outputs; status None when
    they match. The relative difference divides by |reference| floored at atol, so that zeros stay finite.

    What a correct but clumsy kernel gets wrong is `incorrect`; an output that could only pass by
    gaming the check (a tensor subclass, no storage, NaN where the reference is finite) is `rejected`."""
    def mismatch(status: str, why: str) -> tuple[str, str, float, float]:
        return status, why, math.inf, math.inf

    cand, ref = flatten_outputs(candidate), flatten_outputs(reference)
    if len(cand) != len(ref):
        return mismatch("incorrect", f"expected {len(ref)} outputs, got {len(cand)}")
    worst = worst_rel = 0.0
    for i, (c, r) in enumerate(zip(cand, ref)):
        where = f"output {i}: " if len(ref) > 1 else ""
        if not isinstance(r, torch.Tensor):
            r = torch.as_tensor(r, device=c.device if isinstance(c, torch.Tensor) else None)
        if not isinstance(c, torch.Tensor):
            return mismatch("incorrect", f"{where}expected a tensor, got {type(c).__name__}")
        if type(c) is not torch.Tensor or c.layout != torch.strided:
            return mismatch("rejected", f"[not-plain-tensor] {where}the output is a {type(c).__name__} "
                                        f"({c.layout}), not a plain dense torch.Tensor")
        if c.device != r.device:
            return mismatch("rejected", f"[not-plain-tensor] {where}the output is on {c.device}, not {r.device}")
        if c.numel() and c.untyped_storage().data_ptr() == 0:
            return mismatch("rejected", f"[not-plain-tensor] {where}the output has no storage")
        if c.shape != r.shape:
            return mismatch("incorrect", f"{where}shape mismatch: expected {tuple(r.shape)}, got {tuple(c.shape)}")
        if c.dtype != r.dtype:
            return mismatch("incorrect", f"{where}dtype mismatch: expected {r.dtype}, got {c.dtype}")
        atol, rtol = tolerance.get(str(r.dtype).removeprefix("torch."), tolerance["other"])
        c, r = c.detach().double(), r.detach().double()
        bad = ~torch.isfinite(c) & torch.isfinite(r)
        if bad.any():
            return mismatch("rejected", f"[nan-output] {where}{int(bad.sum())} NaN/Inf values where the reference "
                                        "is finite (unwritten output memory reads as NaN here)")
        finite = torch.isfinite(r)
        diff = (c - r).abs()[finite]
        relative = diff / r.abs()[finite].clamp_min(max(atol, 1e-30))
        worst = max(worst, float(diff.max()) if diff.numel() else 0.0)
        worst_rel = max(worst_rel, float(relative.max()) if diff.numel() else 0.0)
        if not torch.allclose(c, r, atol=atol, rtol=rtol, equal_nan=True):
            n_bad = int((diff > (atol + rtol * r.abs())[finite]).sum())
            return "incorrect", (f"{where}{n_bad} of {r.numel()} values differ beyond atol={atol:g}, rtol={rtol:g} "
                                 f"(max abs difference {float(diff.max()):.4g}, max relative "
                                 f"{float(relative.max()):.3g})"), worst, worst_rel
    return None, None, worst, worst_rel


def _repeat_disagrees(first, again, tolerance: float) -> str | None:
    """How a repeated run on the same inputs differs from the first, if beyond `tolerance` of each output's largest
    magnitude (at least 4 epsilons of its dtype; integers exactly), else None."""
    firsts, agains = flatten_outputs(first), flatten_outputs(again)
    if len(firsts) != len(agains):
        return f"returned {len(agains)} outputs instead of {len(firsts)}"
    for i, (a, b) in enumerate(zip(firsts, agains)):
        where = f"output {i} " if i else ""
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
            if type(a) is not type(b):
                return f"{where}changed type"
            continue  # not a tensor: left to the comparison with the reference
        if (a.shape, a.dtype) != (b.shape, b.dtype):
            return f"{where}changed shape or dtype"
        if identical(a, b):
            continue
        if not a.is_floating_point():
            return f"{where}has {int((a != b).sum())} values that changed"
        bound = max(tolerance, 4 * torch.finfo(a.dtype).eps)
        a, b = a.detach().double(), b.detach().double()
        finite = torch.isfinite(a)
        if not torch.equal(finite, torch.isfinite(b)):
            return f"{where}has values that turned NaN/Inf or back"
        scale = float(a[finite].abs().max()) if finite.any() else 0.0
        worst = float((a - b).abs()[finite].max()) if finite.any() else 0.0
        if worst > bound * scale:
            share = worst / scale if scale else math.inf
            return (f"{where}differs from the first by up to {worst:.4g}, {share:.2g} of its largest magnitude "
                    f"({scale:.4g}; allowed: {bound:.2g} of it)")
    return None


def check_correctness(run: RunChild, model, reference) -> tuple[dict | None, float, float]:
    """(the failed result or None, the largest absolute and relative differences seen) over `correct_trials`
    fresh input sets: the candidate first, into poisoned memory, on its own clone of the inputs; on the first
    set `repeat_runs` more times, the last beside a busy kernel, each agreeing with the first run far tighter
    than with the reference (a race that lands inside the tolerance still lands differently each run)."""
    payload, defend = run.payload, run.defend
    worst = worst_rel = 0.0
    for trial in range(payload["correct_trials"]):
        inputs = run.make_inputs(payload["seed"] + 1 + trial)
        try:
            began = time.perf_counter()
            out, args, unsynchronized = run.run_candidate(model, inputs)  # first: no reference result to inherit
            first_ms = (time.perf_counter() - began) * 1e3
            if unsynchronized:
                return run.rejected("[unsynchronized-stream] the output was still being written when forward "
                                    "returned: synchronise side streams with the current stream before returning"), \
                    worst, worst_rel
            repeats = payload["repeat_runs"] if trial == 0 and defend else 0
            for repeat in range(1, repeats + 1):
                again = run.run_candidate(model, inputs, beside_ms=first_ms if repeat == repeats else 0.0)[0]
                if why := _repeat_disagrees(out, again, payload["repeat_tolerance"]):
                    return run.rejected(f"[nondeterministic] run {repeat + 1} on the same inputs {why}: a race (a "
                                        "missing __syncthreads()?) or memory read before it is written"), \
                        worst, worst_rel
                del again
        except Exception as e:
            return {"stage": "candidate", "error": f"{type(e).__name__}: {e}",
                    "traceback": traceback.format_exc()}, worst, worst_rel
        if why := run.reference_conditions_changed():
            return run.rejected(why), worst, worst_rel
        ref_args = clone(inputs) if defend else inputs
        expected = reference(*ref_args)
        run.sync()
        status, why, diff, rel = _compare(out, expected, payload["tolerance"])
        worst, worst_rel = max(worst, diff), max(worst_rel, rel)
        if status == "rejected":
            return run.rejected(why), worst, worst_rel
        if status:
            return {"incorrect": f"trial {trial + 1} of {payload['correct_trials']}: {why}", "trial": trial,
                    "max_abs_diff": diff, "max_rel_diff": rel, "times": run.times}, worst, worst_rel
        if defend and changed(inputs, args) and not changed(inputs, ref_args):
            return run.rejected("[modifies-inputs] the candidate changed its input tensors in place"), worst, worst_rel
        del out, expected, inputs, args, ref_args
    return None, worst, worst_rel


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


def passes_trial(run: RunChild, model, reference, trial: int) -> bool:
    """Whether the candidate, run as the correctness trials run it, matches the reference on trial `trial`'s
    inputs."""
    inputs = run.make_inputs(run.payload["seed"] + 1 + trial)
    out = run.run_candidate(model, inputs)[0]
    return _compare(out, reference(*clone(inputs)), run.payload["tolerance"])[0] is None


def passes_with_reference_parameters(run: RunChild, model, reference, trial: int) -> bool:
    """Whether the failing trial passes once the reference's parameters are copied into the candidate: then its
    kernel is right and its weights are not (made with other init calls, or in another order)."""
    if not copy_parameters(reference, model):
        return False
    try:
        return passes_trial(run, model, reference, trial)
    except Exception:
        return False


def check_own_kernel_share(run: RunChild, windows: dict) -> tuple[dict | None, float | None]:
    """(the rejection or None, the measured share) over every timed call of the candidate, warm-ups included:
    its own kernels must do at least `min_own_kernel_share` of its GPU time, and some kernel must run where
    one runs for the reference. Copies and fills compute nothing as a rule, but a transpose or a cast is work
    a copy does: beyond `max_copy_share` of the candidate's GPU time they count as library work."""
    payload = run.payload
    own = library = copies = 0.0
    others: dict[str, float] = {}
    for label, kernels in windows.items():
        for name, start, end in kernels if label.startswith("candidate/") else ():
            us = end - start
            if NEUTRAL_KERNEL.search(name):
                copies += us
            elif is_own_kernel(name, payload["kernel_names"]):
                own += us
            else:
                library += us
                others[name[:60]] = others.get(name[:60], 0.0) + us
    excess = max(0.0, copies - payload["max_copy_share"] * (own + library + copies))
    if excess:
        others["copies and fills"] = excess
    if own + library + excess == 0:
        reference_ran = any(kernels for label, kernels in windows.items() if label.startswith("reference/"))
        if reference_ran:
            return run.rejected("[own-kernels-idle] no GPU kernel ran during the candidate's forward"), None
        return None, None
    share = own / (own + library + excess)
    if share < payload["min_own_kernel_share"]:
        top = sorted(others, key=others.get, reverse=True)[:3]
        return run.rejected(f"[own-kernels-idle] your own kernels did {share:.0%} of the GPU work; the rest "
                            f"ran in library kernels ({'; '.join(top)})"), share
    return None, share


def _median(xs: list[float]) -> float:
    return sorted(xs)[len(xs) // 2]


def clock_mismatch(calls: dict, windows: dict, opened: dict) -> str | None:
    """Why the clocks disagree on a model's timed calls (medians), if they do. In each call the CUDA events lie
    inside the host's wall clock around them, and the kernels the profiler saw running from the begin event
    (the flush's end, `opened`) on inside the events, so the medians keep that order: events may exceed the
    wall clock by 2 µs (four times the events' resolution) and fall short of the kernels' running time by 5%
    + 5 µs (the profiler's timestamps and the events' are read apart). Faking one clock, the others disagree.
    Events are not held to the wall clock from below: a loaded host can lose any time around the events (a
    synchronize that yields the core), honest calls included."""
    for name, rows in calls.items():
        events, wall = _median([r[1] for r in rows]), _median([r[2] for r in rows])
        kernels = _median([busy_ms(windows.get(r[0], []), opened.get(r[0], -math.inf)) for r in rows])
        if events > wall + 0.002 or events < 0.95 * kernels - 0.005:
            return (f"[clock-mismatch] the {name}'s timed calls take {events:.4g} ms by CUDA events, {wall:.4g} ms "
                    f"by the host's clock and {kernels:.4g} ms of kernels by the profiler")
    return None


def on_every_stream(calls: dict, windows: dict, opened: dict) -> dict:
    """Each timed call's GPU time: its events, or where it is longer the span of its kernels on every stream,
    from the begin event (the flush's end) or an earlier start to the last end: work on a side stream that
    the current stream never waited for, or that started while the flush still ran, is the call's too."""
    return {name: [(label, max(ms, span_ms(windows.get(label, []), opened.get(label, float("inf")))), wall)
                   for label, ms, wall in rows] for name, rows in calls.items()}


def timed_output_wrong(run: RunChild, models: dict, inputs: list, expected, call: int) -> dict:
    """What a wrong timed output says, asked of the candidate again outside the timer, as the correctness
    trials ask it: right now on that input, it was wrong only while timed; wrong now on the first correctness
    input, which it got right before, it changed; wrong on that input alone, it is merely wrong there (an
    honest kernel at the edge of the tolerance, on an input the trials did not draw): `incorrect`. `call`
    counts the timed calls from the first warm-up, 1-based."""
    tolerance = run.payload["tolerance"]
    rule = f"[changed-during-timing] timed call {call} returned a wrong result "
    again = run.run_candidate(models["candidate"], inputs)[0]
    status, why, diff, rel = _compare(again, expected, tolerance)
    if status is None:
        return run.rejected(rule + "that it gets right outside the timer")
    if not passes_trial(run, models["candidate"], models["reference"], 0):
        return run.rejected(rule + "and now gets the first correctness trial wrong too")
    if status == "rejected":
        return run.rejected(why)
    return {"incorrect": f"timed call {call}, on inputs the correctness trials did not draw: {why}",
            "max_abs_diff": diff, "max_rel_diff": rel, "times": run.times}


def time_models(run: RunChild, models: dict) -> tuple[dict | None, dict[str, list[tuple[str, float, float]]]]:
    """(the rejection or None, each model's timed calls as (label, events ms, wall ms)): warm-up, then the
    models in a random order each trial on an independent draw of inputs (what one call returned says
    nothing of the next), so that clock drift hits them alike; random timed outputs are compared with the
    reference's on the same inputs. Every call of the candidate looks the same to it: the same draw for
    both models, the same memory, the same profiler. On a GPU the timer also times the least a model can do
    ('timer'): one kernel on one element, whose time is the latency that a loaded host, or other processes'
    work on the same GPU, adds to a tiny model's (`slowed_reference`)."""
    payload, defend, timed = run.payload, run.defend, run.timer
    if run.cuda and defend:
        models = {**models, "timer": lambda *inputs: run.flush[:1].zero_()}
    calls = {name: [] for name in models}
    unknowable = random.Random(os.urandom(8))  # draws, orders and spot checks: nothing to learn in advance
    draws = unknowable.randrange(2**31)
    deadline = None
    for trial in range(-payload["warmup"], payload["timing_trials"]):
        if trial == 0:
            deadline = time.perf_counter() + payload["timing_budget_s"]
        if defend or trial == -payload["warmup"]:
            inputs = run.make_inputs(draws + trial)
        order = unknowable.sample(list(models), len(models)) if defend else list(models)
        outputs = {}
        for name in order:
            if name == "reference" and (why := run.reference_conditions_changed()):
                return run.rejected(why), calls
            label = f"{name}/{trial}"
            events, wall, outputs[name] = timed(models[name], clone(inputs) if defend else inputs, label)
            if trial >= 0:
                calls[name].append((label, events, wall))
        checked = defend and "candidate" in models and (
            trial in (0, payload["timing_trials"] - 1) or unknowable.random() < 0.25)
        if checked and _compare(outputs["candidate"], outputs["reference"], payload["tolerance"])[0]:
            return timed_output_wrong(run, models, inputs, outputs["reference"], trial + payload["warmup"] + 1), calls
        del outputs
        if trial + 1 >= 10 and time.perf_counter() > deadline:
            break
    return None, calls


def _prepare(payload: dict) -> tuple[RunChild, torch.nn.Module]:
    """A run child's state and the reference, and, before any candidate code: the timer, the kernel log
    (profiling on from here, so that torch's first profile, which loads torch._dynamo and wraps
    torch.manual_seed, predates the tamper snapshot) and the process-wide settings."""
    run = RunChild(payload)
    torch.manual_seed(payload["seed"])
    reference = run.task.Model(*run.init_inputs).to(run.device).eval()
    if run.cuda and run.defend:
        run.kernel_log = KernelLog()
    run.timer = make_timer(run)
    with torch.no_grad():  # noted as the reference will run: without autograd
        run.settings = ProcessSettings() if run.defend else None
    return run, reference


def _window_labels(payload: dict, calls: dict) -> set[str]:
    return {f"{name}/{trial}" for name in calls for trial in range(-payload["warmup"], payload["timing_trials"])}


def reference_times(calls: dict, windows: dict) -> dict[str, float]:
    """What `slowed_reference` compares, from one child's timed calls: the reference's fastest call, and on a
    GPU the timer's fastest call on one element and the median GPU time of the reference's kernels."""
    times = {"reference_min_ms": min(events for _, events, _ in calls["reference"])}
    if "timer" in calls:
        times["timer_min_ms"] = min(events for _, events, _ in calls["timer"])
    if windows:
        times["reference_kernel_ms"] = _median([busy_ms(windows.get(label, [])) for label, _, _ in calls["reference"]])
    return times


def _reference_alone(payload: dict) -> dict:
    """The reference timed as in a candidate's child, in one that never imports candidate code: what the
    reference takes when nothing has slowed it (`slowed_reference`)."""
    run, reference = _prepare(payload)
    with torch.no_grad():
        _, calls = time_models(run, {"reference": reference})
    windows, opened = run.kernel_log.stop(_window_labels(payload, calls)) if run.kernel_log else ({}, {})
    return reference_times(on_every_stream(calls, windows, opened), windows)


def _run(payload: dict) -> dict:
    """The run child's job: build both models, check the candidate on fresh inputs, then time both
    alternately with every call's kernels logged (or, with `reference_alone`, time the reference only).

    Defences, each named in the feedback when it fires: the candidate runs before the reference on its
    own clone of fresh inputs, into memory poisoned with NaN; its inputs must come back unchanged; it
    runs 1 + repeat_runs times on the first input set and must agree with itself far tighter than with the
    reference; the reference runs under the settings
    noted before the candidate was imported; its own kernels must do the work on the very calls that are
    timed (profiler); random timed outputs are checked too; three clocks must agree; the timer and the
    checks must still be the ones this process started with."""
    if payload.get("reference_alone"):
        return _reference_alone(payload)
    start = time.perf_counter()
    run, reference = _prepare(payload)
    compiled = None
    if payload["compile_baseline"]:  # compiled now: the threads and patches of torch.compile predate the snapshot
        compiled = torch.compile(reference)
        with torch.no_grad():
            compiled(*run.make_inputs(payload["seed"]))
    tamper = TamperCheck(payload, sys.modules[__name__])

    candidate = import_file(payload["candidate"], "candidate")
    torch.manual_seed(payload["seed"])
    try:
        model = candidate.ModelNew(*run.init_inputs).to(run.device).eval()
    except Exception as e:  # a candidate whose constructor fails is a runtime error, not a harness error
        return {"stage": "init", "error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()}
    if payload["copy_parameters"]:
        copy_parameters(reference, model)
    run.times["load"] = time.perf_counter() - start

    start = time.perf_counter()
    with torch.no_grad():
        failed, worst, worst_rel = check_correctness(run, model, reference)
        if failed and "incorrect" in failed and not payload["copy_parameters"]:
            failed["weights_differ"] = passes_with_reference_parameters(run, model, reference, failed["trial"])
    if failed:
        return failed
    run.times["correctness"] = time.perf_counter() - start
    if broken := tamper.broken():
        return run.rejected(broken)

    start, cpu_start = time.perf_counter(), time.process_time()
    models = {"candidate": model, "reference": reference, **({"compiled": compiled} if compiled is not None else {})}
    with torch.no_grad():
        failed, calls = time_models(run, models)
    if failed:
        return failed
    run.times["timing"] = time.perf_counter() - start
    cpu_share = None if run.cuda else (time.process_time() - cpu_start) / run.times["timing"]
    start = time.perf_counter()
    windows, opened = run.kernel_log.stop(_window_labels(payload, calls)) if run.kernel_log else ({}, {})
    run.times["profile"] = time.perf_counter() - start
    if broken := tamper.broken():
        return run.rejected(broken)
    share = None
    if run.defend:
        if run.cuda and (mismatch := clock_mismatch(calls, windows, opened)):
            return run.rejected(mismatch)
        if run.cuda and payload["min_own_kernel_share"] > 0:
            failed, share = check_own_kernel_share(run, windows)
            if failed:
                return failed
    calls = on_every_stream(calls, windows, opened)
    medians = {name: _median([ms for _, ms, _ in rows]) for name, rows in calls.items() if name in models}
    return {"medians": medians, "trials": len(calls["candidate"]), "max_abs_diff": worst,
            "max_rel_diff": worst_rel, "times": run.times,
            "own_kernel_share": share, "cpu_share": cpu_share, **reference_times(calls, windows)}


# ----------------------------------------------------------------------------------------------------
# Feedback


# The finest time either timer tells apart: CUDA events resolve about 0.5 us (perf_counter, on the CPU, far
# finer). A median below it cannot be told from zero, so both times are floored at it: a kernel too fast to
# time gets a large but finite speedup ("at least this fast"), never an infinite one.
TIMER_RESOLUTION_MS = 5e-4


# A checking child timing on the CPU that was on a core for less than this share of the wall time lost the
# core to other work: its times, and above all the reference's, are then slower than alone (`busy`).
BUSY = 0.8


def speedup(reference_ms: float, candidate_ms: float) -> float:
    """reference / candidate, each floored at TIMER_RESOLUTION_MS; 0.0 (no credit) if either is not a finite
    number, which no timer gives."""
    if not (math.isfinite(reference_ms) and math.isfinite(candidate_ms)):
        return 0.0
    return max(reference_ms, TIMER_RESOLUTION_MS) / max(candidate_ms, TIMER_RESOLUTION_MS)


# How many more clean children time the reference before a first `slowed_reference` stands.
CLEAN_RETIMES = 3

# At most how many times slower than in the clean child a loaded host may make the timer's own overhead in
# the candidate's (`slowed_reference`): a bound on what a child's made-up answer can excuse.
MAX_HOST_LOAD = 4.0


def slowed_reference(outcome: dict, clean: dict | None, max_slowdown: float) -> str | None:
    """Why a correct candidate's reference time cannot stand, if it cannot: beside the candidate the reference
    ran slower than in a clean process beyond `max_slowdown` (and 5 µs): its fastest call, fastest against
    fastest since other work on the machine only ever adds time, or on a GPU the median GPU time of its
    kernels, which the host's load does not touch. On a GPU a tiny model's events are mostly latency, which a
    loaded host, or other processes' kernels on the same GPU, inflate in every call: the fastest-call
    allowance scales by how much slower the timer's one-element kernel ran beside the candidate than in the
    clean process (up to MAX_HOST_LOAD). The parent compares with times it measured itself, so a made-up
    answer of the child cannot claim a slow reference beyond that either."""
    if "medians" not in outcome or not clean:
        return None
    child = {key: outcome.get(key) for key in clean}
    if not all(isinstance(v, (int, float)) and math.isfinite(v) for v in child.values()):
        return "[slowed-reference] the checking child did not say how long the reference took"
    load = 1.0
    if clean.get("timer_min_ms"):
        load = min(MAX_HOST_LOAD, max(1.0, child["timer_min_ms"] / clean["timer_min_ms"]))
    if child["reference_min_ms"] > clean["reference_min_ms"] * max_slowdown * load + 5e-3:
        host = f", with the timer's one-element kernel {load:.2g}x as slow" if load > 1 else ""
        return (f"[slowed-reference] the reference took {child['reference_min_ms']:.4g} ms (fastest call) beside "
                f"the candidate and {clean['reference_min_ms']:.4g} ms in a process of its own{host}: the "
                "candidate slowed it down")
    if "reference_kernel_ms" in clean and \
            child["reference_kernel_ms"] > clean["reference_kernel_ms"] * max_slowdown + 5e-3:
        return (f"[slowed-reference] the reference's kernels took {child['reference_kernel_ms']:.4g} ms per call "
                f"beside the candidate and {clean['reference_kernel_ms']:.4g} ms in a process of its own: the "
                "candidate slowed them down")
    return None


def make_result(status: str, feedback: str, **fields) -> dict:
    result = {"status": status, "compiled": status in ("runtime_error", "incorrect", "correct"),
              "correct": status == "correct", "runtime_ms": None, "ref_runtime_ms": None, "speedup": None,
              "max_abs_diff": None, "max_rel_diff": None, "feedback": feedback, "time_s": {}}
    result.update(fields)
    return result


WEIGHTS_DIFFER = (" With the reference's parameters copied into ModelNew, the same inputs give the right output: "
                  "your kernel is right, your weights are not. Create each parameter as the reference's layer does "
                  "(the same shape, the same init calls, in the same order), so that after the same seed they match.")


def build_feedback(outcome: dict, *, build_root: str, candidate_path: str, timeout_s: float,
                   rules: str = "kevin") -> dict:
    """Turn what a build or run child sent back into an eval record with the text the model reads."""
    if outcome.get("timeout"):
        return make_result("timeout", f"Timeout: the kernel did not finish within {timeout_s:.0f} s "
                           "(an infinite loop, a deadlock, or far too slow).")
    if outcome.get("signal") == signal.SIGSYS:
        return make_result("rejected", rejection(rules, [SANDBOX_RULE]), compiled=True)
    if "crash" in outcome:
        log = first_lines("\n".join(ln for ln in outcome.get("log", "").splitlines()
                                     if re.search(r"error|Error|fault|abort|Abort", ln)))
        return make_result("runtime_error", f"Runtime error: {outcome['crash']}." + (f"\n{log}" if log else ""))
    if "rejected" in outcome:
        return make_result("rejected", rejection(rules, [outcome["rejected"]]), time_s=outcome["times"],
                           compiled=True)  # built and ran, then caught at run time
    if "incorrect" in outcome:
        return make_result("incorrect", f"Incorrect output: {outcome['incorrect']}." + (
            WEIGHTS_DIFFER if outcome.get("weights_differ") else ""), max_abs_diff=outcome["max_abs_diff"],
            max_rel_diff=outcome.get("max_rel_diff"), time_s=outcome["times"])
    if "error" in outcome:
        frames = last_frames(outcome.get("traceback", ""), candidate_path)
        message = first_lines(outcome["error"])
        return make_result("runtime_error", f"Runtime error: {message}" + (f"\n{frames}" if frames else ""))
    medians = outcome["medians"]
    cand, ref = medians["candidate"], medians["reference"]
    ratio = speedup(ref, cand)
    extra = {}
    if "compiled" in medians:
        extra = {"compile_ref_runtime_ms": medians["compiled"],
                 "speedup_vs_compile": speedup(medians["compiled"], cand)}
    return make_result(
        "correct",
        f"Correct. Your kernel runs in {cand:.4g} ms against {ref:.4g} ms for the PyTorch reference: "
        f"a speedup of {ratio:.2f}x. It can be made faster.",
        runtime_ms=cand, ref_runtime_ms=ref, speedup=ratio, max_abs_diff=outcome["max_abs_diff"],
        max_rel_diff=outcome.get("max_rel_diff"),
        time_s=outcome["times"], timing_trials=outcome["trials"], own_kernel_share=outcome["own_kernel_share"],
        timing_cpu_share=outcome["cpu_share"], busy=outcome["cpu_share"] is not None and outcome["cpu_share"] < BUSY,
        **extra)


# ----------------------------------------------------------------------------------------------------
# The scheduler


def resolve_device(cfg: EvalConfig) -> tuple[str, list[str]]:
    """('cuda' or 'cpu', the torch devices that run candidates, one worker each)."""
    kind = cfg.device
    if kind == "auto":
        kind = "cuda" if torch.cuda.device_count() > 0 else "cpu"
    if kind == "cpu":
        return "cpu", ["cpu"]
    count = torch.cuda.device_count()
    gpus = cfg.gpus if cfg.gpus is not None else list(range(count))
    if not gpus or any(g < 0 or g >= count for g in gpus):
        raise SystemExit(f"error: asked for GPUs {gpus} but {count} are visible")
    return "cuda", [f"cuda:{g}" for g in gpus]


def evaluate(records: list[dict], cfg: EvalConfig | None = None, on_result=None) -> list[dict]:
    """Evaluate many candidates at once; returns one eval dict per record, in order.

    Each record has `task` (an id under cfg.tasks, or a task file) and `code` (a candidate or a whole
    reply). `on_result(index, result)` is called as each finishes. Identical (task, code) pairs are
    evaluated once and share the result."""
    return _Evaluation(cfg or EvalConfig(), len(records), on_result).run(records)


SANDBOX_RULE = ("[sandbox] the candidate made a system call the sandbox forbids (a network socket, ptrace, "
                "another process's memory, mount or namespaces) and was killed")
def _number(value) -> float:
    """A number a child reported, or 0.0 where it reported none (or something else)."""
    return float(value) if isinstance(value, (int, float)) and math.isfinite(value) else 0.0


# The least own-kernel share under the kernelbench rules: any at all, i.e. your kernels must run.
KERNELS_MUST_RUN = 1e-9


def own_kernel_share_needed(cfg: EvalConfig) -> float:
    """The share the profiler holds the candidate to: --min-own-kernel-share under kevin; under kernelbench, whose
    candidates may leave the heavy op to PyTorch, only that its kernels run (unless the check is off)."""
    if cfg.rules == "kevin" or cfg.min_own_kernel_share == 0:
        return cfg.min_own_kernel_share
    return KERNELS_MUST_RUN


def _run_payload(cfg: EvalConfig, task_path: str, candidate: str, kernels: list[str], device: str) -> dict:
    """What a run child gets: the files, the device and every setting of the check and the timing."""
    return {"task": task_path, "candidate": candidate, "device": device, "seed": cfg.seed,
            "correct_trials": cfg.correct_trials, "tolerance": tolerances(cfg),
            "timing_trials": cfg.timing_trials, "timing_budget_s": cfg.timing_budget_s,
            "warmup": cfg.warmup, "compile_baseline": cfg.compile_baseline,
            "min_own_kernel_share": own_kernel_share_needed(cfg), "poison_bytes": cfg.poison_bytes,
            "defences": cfg.defences, "cpu_threads": cfg.cpu_threads, "kernel_names": kernels,
            "max_copy_share": cfg.max_copy_share, "repeat_runs": cfg.repeat_runs,
            "repeat_tolerance": cfg.repeat_tolerance, "copy_parameters": cfg.copy_parameters}


def _build_failure(outcome: dict, candidate: str, build_root: str, timeout_s: float, seconds: float,
                   rules: str) -> dict:
    """The result of a candidate whose build child timed out, crashed or raised."""
    if outcome.get("timeout"):
        return make_result("timeout", f"Timeout: building took longer than {timeout_s:.0f} s.")
    if outcome.get("signal") == signal.SIGSYS:
        return make_result("rejected", rejection(rules, [SANDBOX_RULE]))
    message = outcome.get("error") or outcome["crash"] + "\n" + outcome.get("log", "")
    if "Error building extension" in message:
        message = "Compilation failed:\n" + trim_compiler_output(message, build_root)
    else:
        message = "Loading the module failed: " + first_lines(message) + "\n" + \
                  last_frames(outcome.get("traceback", ""), candidate)
    return make_result("compile_error", message.strip(), time_s={"compile": round(seconds, 3)},
                       cpu_s={"compile": round(outcome.get("cpu_s", 0.0), 3)})


_CLEAN_REFERENCE: dict[str, dict | None] = {}  # clean_reference's, kept across evaluate() calls


class _Evaluation:
    """One call of `evaluate`: the static rules here, every distinct candidate imported in a build child (one
    thread each), whose extensions the build cache compiles, at most cfg.compile_workers at once, and one
    thread per device that runs each built candidate in a fresh child set up ahead."""

    def __init__(self, cfg: EvalConfig, count: int, on_result):
        self.cfg, self.on_result = cfg, on_result
        self.kind, self.devices = resolve_device(cfg)
        self.mechanisms = sandbox_mechanisms(cfg.sandbox)
        self.index = load_tasks(cfg.tasks) if Path(cfg.tasks).exists() else {}
        self.build_root = str(Path(cfg.build_dir).resolve())
        Path(self.build_root).mkdir(parents=True, exist_ok=True)
        self.results: list[dict | None] = [None] * count
        self.lock = threading.Lock()
        self.ready: queue.Queue = queue.Queue()  # built candidates, for the device threads
        self.to_run = 0  # distinct candidates that may still reach a device
        self.stopping = False  # interrupted: what children say from now on is no result
        self.progress = None
        if cfg.progress:
            from tqdm import tqdm

            self.progress = tqdm(total=count, desc=f"evaluate ({self.kind} x{len(self.devices)})", file=sys.stderr)

    def run(self, records: list[dict]) -> list[dict]:
        start_fork_server()  # from this thread, before the threads that start children
        workdir = tempfile.mkdtemp(prefix="eval-", dir=self.build_root)
        try:
            jobs = self.write_candidates(self.apply_static_rules(records), workdir)
            readable = sandbox.readable([self.build_root, str(ROOT), self.cfg.tasks,
                                         *{str(Path(task).parent) for task, *_ in jobs}], hidden_from_children())
            self.settings = child_settings(self.kind, readable, self.mechanisms)
            self.cache = BuildCache(Path(self.build_root), self.settings["run"].env.get("TORCH_CUDA_ARCH_LIST", ""),
                                    self.cfg.compile_workers, self.compile, self.cfg.compile_timeout_s)
            self.workdir, self.compiles = workdir, itertools.count()
            self.to_run = len(jobs)
            workers = [threading.Thread(target=self.feed_device, args=(d, workdir, len(jobs)), daemon=True)
                       for d in self.devices]
            with ThreadPoolExecutor(max_workers=max(1, len(jobs))) as pool:  # waiting for a build takes no slot
                builds = []
                try:  # from the first thread on: a Ctrl-C that skipped the stop would leave children running
                    for w in workers:
                        w.start()
                    for job in jobs:  # one at a time: each is in `builds` for the stop as soon as it exists
                        builds.append(pool.submit(self.build, job))
                    for b in builds:
                        b.result()
                    for _ in workers:
                        self.ready.put(None)
                    for w in workers:
                        w.join()
                except KeyboardInterrupt:
                    self.stop(builds, workers)
                    raise
        finally:
            if self.progress:
                self.progress.close()
            shutil.rmtree(workdir, ignore_errors=True)
        timed = [r for r in self.results if r.get("timing_cpu_share") is not None]
        if busy := sum(r["busy"] for r in timed):
            print(f"warning: the machine was busy: {busy} of {len(timed)} timed candidates had less than {BUSY:.0%} of "
                  f"a core while timed (load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores); their "
                  "speedups are unreliable", file=sys.stderr)
        return self.results

    def stop(self, builds: list, workers: list[threading.Thread]) -> None:
        """On Ctrl-C: no result from here on (a child this stop kills would read as a crash), and every child
        killed until no thread waits on one; a second Ctrl-C does not cut that short."""
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
        with self.lock:
            self.stopping = True
        for _ in workers:
            self.ready.put(None)
        try:
            while not all(b.done() for b in builds) or any(w.is_alive() for w in workers):
                stop_every_child()
                time.sleep(0.05)
        finally:
            signal.signal(signal.SIGINT, previous)

    def finish(self, indices: list[int], result: dict, started: float) -> None:
        result["time_s"] = {**result.get("time_s", {}), "total": round(time.perf_counter() - started, 3)}
        with self.lock:
            if self.stopping:
                return
            for i in indices:
                self.results[i] = dict(result, time_s=dict(result["time_s"]), rules=self.cfg.rules)
                if self.on_result:
                    self.on_result(i, self.results[i])
            if self.progress:
                self.progress.update(len(indices))

    def apply_static_rules(self, records: list[dict]) -> dict[tuple[str, str], list[int]]:
        """Finish every record that has no valid candidate; group the others by identical (task, code)."""
        groups: dict[tuple[str, str], list[int]] = {}
        for i, record in enumerate(records):
            started = time.perf_counter()
            try:
                task_path = str(resolve_task(str(record["task"]), self.index))
            except (KeyError, ValueError) as e:
                self.finish([i], make_result("format_error", f"Bad record: {e}"), started)
                continue
            code = extract_code(str(record.get("code") or ""))
            if not code or not code.strip():
                self.finish([i], make_result("format_error", "Format error: the reply has no complete fenced "
                                             "code block with the solution (```python ... ```)."), started)
                continue
            verdict = static_check(code, self.kind, self.cfg.rules)
            if verdict:
                self.finish([i], make_result(*verdict), started)
                continue
            groups.setdefault((task_path, code), []).append(i)
        return groups

    @staticmethod
    def write_candidates(groups: dict[tuple[str, str], list[int]], workdir: str) -> list[tuple]:
        """Each distinct candidate in its own folder: (task file, candidate file, its kernels' names, record
        indices)."""
        jobs = []
        for n, ((task_path, code), indices) in enumerate(groups.items()):
            folder = Path(workdir) / f"c{n:05d}"
            folder.mkdir()
            (folder / "solution.py").write_text(code)
            jobs.append((task_path, str(folder / "solution.py"), kernel_names(code), indices))
        return jobs

    def fewer_to_run(self) -> int:
        with self.lock:
            self.to_run -= 1
            return self.to_run

    def compile(self, payload: dict, writable: list[str], timeout_s: float) -> dict:
        """The build cache's compiler: one extension, in a compile child that may write only `writable`."""
        log = str(Path(self.workdir) / f"compile-{next(self.compiles)}.log")
        return run_in_child(compile_extension, payload, self.settings["compile"], timeout_s, log, writable)

    def build(self, job: tuple) -> None:
        """Import one candidate in a child, which has the cache build its extensions, then queue it for a
        device, or finish it as a build failure."""
        task_path, candidate, _, indices = job
        started = time.perf_counter()
        with self.cache.slot():
            if self.stopping:
                return
            outcome = run_in_child(_build, {"candidate": candidate}, self.settings["build"],
                                   self.cfg.compile_timeout_s, str(Path(candidate).with_name("build.log")),
                                   serve=self.cache.request)
        outcome["cpu_s"] = _number(outcome.get("cpu_s")) + self.cache.compile_cpu_s()
        if not (outcome.get("timeout") or "crash" in outcome or "error" in outcome):
            self.ready.put((job, started, _number(outcome.get("seconds")), outcome["cpu_s"]))
            return
        self.fewer_to_run()  # it will not reach a device
        self.finish(indices, _build_failure(outcome, candidate, self.build_root, self.cfg.compile_timeout_s,
                                            time.perf_counter() - started, self.cfg.rules), started)

    def clean_reference(self, payload: dict, log: str, now: bool = False) -> dict | None:
        """The reference's `reference_times` in a child that never imports candidate code, measured once per
        task, device and timing settings in this process, or with `now` again (None where it could not be
        timed)."""
        key = json.dumps({k: v for k, v in payload.items() if k not in ("candidate", "kernel_names")}, sort_keys=True)
        if now or key not in _CLEAN_REFERENCE:
            outcome = finish_child(start_child(_run, self.settings["run"], log, payload["device"]),
                                   {**payload, "reference_alone": True}, self.cfg.run_timeout_s)
            times = {k: _number(v) for k, v in outcome.items() if k.startswith(("reference_", "timer_"))}
            _CLEAN_REFERENCE[key] = times if times.get("reference_min_ms") else None
        return _CLEAN_REFERENCE[key]

    def slowed_against_every_retiming(self, outcome: dict, clean: dict | None, payload: dict, logs) -> str | None:
        """`slowed_reference`, if it holds against the clean reference timed once per task and then against
        each of CLEAN_RETIMES more clean children timed right now, under whatever else runs now. A process's
        speed is partly its own: on the 2-core CPU machine the fastest call of one 1 MB ReLU ranged from 0.031
        to 0.096 ms across fresh processes, so one clean process that happened to be fast proves nothing. A
        reference that the candidate slowed is slower than all of them."""
        why = slowed_reference(outcome, clean, self.cfg.max_reference_slowdown)
        for _ in range(CLEAN_RETIMES):
            if not why:
                break
            why = slowed_reference(outcome, self.clean_reference(payload, next(logs), now=True),
                                   self.cfg.max_reference_slowdown)
        return why

    def run_candidate(self, child, payload: dict, clean: dict | None, logs, device: str) -> dict:
        """The candidate's outcome from `child`, but a [slowed-reference] that holds against every clean
        re-timing is put to one more child of the candidate's own: a candidate that slows the reference slows
        it there too, while a moment's load (a build on the other core of the CPU machine made one honest
        candidate's reference 2.5x slower than in three clean children) seldom strikes twice. The second run
        then stands whole, its reference time checked as the first's was."""
        for attempt in range(2):
            if attempt:
                child = start_child(_run, self.settings["run"], next(logs), device)
            outcome = finish_child(child, payload, self.cfg.run_timeout_s, serve=self.cache.request)
            why = self.slowed_against_every_retiming(outcome, clean, payload, logs)
            if not why:
                return outcome
        return {"rejected": why, "times": outcome.get("times", {})}

    def feed_device(self, device: str, workdir: str, candidates: int) -> None:
        """Run built candidates on one device until the queue says stop (run_queued), quietly where a Ctrl-C
        stops it."""
        if self.stopping:  # a Ctrl-C overtook this thread's start: the stop did not count it alive, so it
            return  # may already have removed the work folder
        try:
            self.run_queued(device, workdir, candidates)
        except Exception:
            if not self.stopping:  # else it failed on a child the stop killed: no traceback, the stop says it
                raise

    def run_queued(self, device: str, workdir: str, candidates: int) -> None:
        """Each candidate gets a fresh child, set up ahead (no more spares than candidates left to run); the
        oldest spare has had the longest to get ready."""
        logs = (str(Path(workdir) / f"run-{device.replace(':', '')}-{n}.log") for n in itertools.count())
        spares = collections.deque(start_child(_run, self.settings["run"], next(logs), device)
                                   for _ in range(min(self.cfg.spare_children, candidates)))
        while (item := self.ready.get()) is not None and not self.stopping:
            left = self.fewer_to_run()
            (task_path, candidate, kernels, indices), started, build_s, build_cpu_s = item
            child = spares.popleft() if spares else None
            if child is None or not child[0].is_alive():
                child = start_child(_run, self.settings["run"], next(logs), device)
            if len(spares) < min(self.cfg.spare_children, left):
                spares.append(start_child(_run, self.settings["run"], next(logs), device))
            payload = _run_payload(self.cfg, task_path, candidate, kernels, device)
            clean = self.clean_reference(payload, next(logs)) if self.cfg.defences else None
            run_started, sent_at = time.perf_counter(), time.time()
            outcome = self.run_candidate(child, payload, clean, logs, device)
            try:
                result = build_feedback(outcome, build_root=self.build_root, candidate_path=candidate,
                                        timeout_s=self.cfg.run_timeout_s, rules=self.cfg.rules)
                times = {k: round(v, 3) for k, v in result["time_s"].items()}
            except (KeyError, TypeError, ValueError, AttributeError):  # the child is the candidate's: it may lie
                result, times = make_result("runtime_error", "Runtime error: the checking child's answer is "
                                            "malformed."), {}
            waited = max(0.0, _number(outcome.get("ready_at", sent_at)) - sent_at)  # the child was still setting up
            result["time_s"] = {"compile": round(build_s, 3), "run": round(time.perf_counter() - run_started, 3),
                                "wait": round(waited, 3), **times}
            result["cpu_s"] = {"compile": round(build_cpu_s, 3), "run": round(_number(outcome.get("cpu_s")), 3)}
            self.finish(indices, result, started)
        for spare in spares:
            stop_child_later(spare)


# ----------------------------------------------------------------------------------------------------
# Command line


def summary_table(evals: list[dict], records: list[dict]) -> str:
    """One row per candidate (for small runs), counts per status, then speedups over the correct ones."""
    if not evals:
        return "no rows: no candidates were evaluated"
    lines = []
    if len(evals) <= 40:
        lines += ["| candidate | status | speedup | runtime ms | eager ms |", "|---|---|---|---|---|"]
        for record, e in zip(records, evals):
            name = record.get("solution") or record["task"]
            fmt = lambda v: f"{v:.3f}" if isinstance(v, float) else "-"  # noqa: E731
            lines.append(f"| {name} | {e['status']} | {fmt(e['speedup'])} | {fmt(e['runtime_ms'])} "
                         f"| {fmt(e['ref_runtime_ms'])} |")
        lines.append("")
    counts = {s: sum(e["status"] == s for e in evals) for s in STATUSES}
    speedups = [e["speedup"] for e in evals if e["correct"]]
    lines += ["| status | count |", "|---|---|"] + [f"| {s} | {n} |" for s, n in counts.items() if n]
    geomean = 0.0 if not speedups or min(speedups) == 0 else math.exp(sum(map(math.log, speedups)) / len(speedups))
    over_correct = f"geomean {geomean:.3f}x, max {max(speedups):.3f}x" if speedups else "-"
    lines += [f"| **total** | {len(evals)} |", "",
              f"correct: {len(speedups)}/{len(evals)}; speedup over correct: {over_correct}; faster than eager: "
              f"{sum(s > 1 for s in speedups)}"]
    return "\n".join(lines)


def _parser() -> argparse.ArgumentParser:
    """The input and output, then one flag per EvalConfig field (config_flags.py)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("input", nargs="?", help="JSONL of candidates (`task`, `code`); `-` for stdin; "
                   "default: the hand-written candidates in solutions/<device>/")
    p.add_argument("-o", "--output", help="append results here (resuming a run) instead of stdout")
    add_config_flags(p, EvalConfig)
    return p


DEMO_RUN_TIMEOUT_S = 30.0


def _config(args: argparse.Namespace) -> EvalConfig:
    """The flags given, over EvalConfig's defaults (a bad value is a one-line error); the CPU demo (no input,
    no --tasks) takes the CPU-sized copies of the tasks in tests/tasks/, and a run timeout that its candidates
    (each checked in seconds) never reach but its hanging one soon does."""
    given = given_flags(args, EvalConfig)
    try:
        cfg = EvalConfig(**given)
    except ValueError as e:
        raise SystemExit(f"error: {e}") from None
    if args.input is None and "tasks" not in given and resolve_device(cfg)[0] == "cpu":
        cfg.tasks = str(ROOT / "tests" / "tasks")
        if "run_timeout_s" not in given:  # its hanging candidate holds a core for this long, not 180 s
            cfg.run_timeout_s = DEMO_RUN_TIMEOUT_S
    return cfg


def _input_records(source: str | None, cfg: EvalConfig) -> tuple[str, list[dict]]:
    """(where they came from, the records): the JSONL input, or else the hand-written candidates; every task
    id resolved up front, so that a typo stops the run before anything is built."""
    if source is None:
        kind, _ = resolve_device(cfg)
        source = f"solutions/{kind}"
        print(f"no input: evaluating the hand-written candidates in {source}/", file=sys.stderr)
        records = library_records(ROOT / "solutions" / kind)
    else:
        records = read_records(source)
    index = load_tasks(cfg.tasks) if Path(cfg.tasks).exists() else {}
    for number, record in enumerate(records, 1):
        try:
            resolve_task(str(record["task"]), index)
        except ValueError as e:
            raise SystemExit(f"error: {source}: record {number}: {e}")
    return source, records


def main(argv=None):
    args = _parser().parse_args(argv)
    cfg = _config(args)
    _, records = _input_records(args.input, cfg)
    done = already_written(args.output, records) if args.output else 0
    if done:
        print(f"resuming: {done} of {len(records)} already in {args.output}", file=sys.stderr)
    # The demo prints only its table unless asked to keep the records; a pipeline gets them on stdout.
    out = open(args.output, "a") if args.output else open(os.devnull, "w") if args.input is None else sys.stdout
    pending, written = {}, []

    def write_in_order(i: int, result: dict):
        pending[i] = result
        while len(written) in pending:  # results come in any order; lines go out in input order
            result = pending.pop(len(written))
            out.write(json.dumps({**records[done + len(written)], "eval": result}) + "\n")
            out.flush()
            written.append(result)

    try:
        evaluate(records[done:], cfg, on_result=write_in_order)
    except KeyboardInterrupt:  # evaluate has dropped what its stopped children would have said
        print(f"interrupted: {done + len(written)} of {len(records)} written; re-run to resume", file=sys.stderr)
        raise SystemExit(130) from None
    finally:
        if out is not sys.stdout:
            out.close()
    print(summary_table(written, records[done:]), file=sys.stderr)


if __name__ == "__main__":
    main()
