"""The evaluator that evaluate.py, generate.py, train.py and warm_start.py share: its config, and `evaluate` /
`Evaluator`, which take candidate records and give back a status, a speedup and the feedback each one earns.

It reads in the order a candidate goes: the config, the tolerances, the feedback, then the scheduler
(`Evaluator`): every distinct candidate is built in a child process from a pool sized to the cores (through
kevin/build_cache.py), then judged on its GPU by a fresh judge/runner pair (kevin/judge.py, kevin/runner.py),
each pair set up while the ones before it run. What happens where, and why, is in evaluate.py's docstring."""
from __future__ import annotations

import collections
import contextlib
import itertools
import math
import os
import queue
import re
import shutil
import signal
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path

from kevin.dependencies import require

require("torch")

import torch

from kevin import sandbox
from kevin.build_cache import BuildCache, build_candidate, compile_extension
from kevin.config_flags import AT_LEAST_1, NOT_NEGATIVE, POSITIVE, SHARE, check, one_of
from kevin.eval_children import child_settings, first_lines, last_frames, sandbox_mechanisms, trim_compiler_output
from kevin.isolation import (cpu_seconds, finish_child, gpus_on_machine, hidden_from_children, peers, pin,
                             run_in_child, start_child, start_fork_server, stop_child, stop_child_later,
                             stop_every_child, timing_cores)
from kevin.tasks import index_tasks, resolve_task
from kevin.judge import judge
from kevin.runner import run
from kevin.static_rules import RULE_PROFILES, extract_code, kernel_names, rejection, static_check

ROOT = Path(__file__).resolve().parents[1]
STATUSES = ("format_error", "rejected", "compile_error", "runtime_error", "timeout", "incorrect", "correct")
RUNNER_GRACE_S = 5.0  # how long past the judge's deadline the runner is served before it is stopped as well


@dataclass
class EvalConfig:
    device: str = "auto"
    """'cuda' (CUDA candidates, one worker per GPU), 'cpu' (C++ candidates) or 'auto' (cuda if visible)"""
    gpus: list[int] | None = None
    """GPU indices to spread candidates over, comma-separated on the command line (default: every visible GPU)"""
    tasks: str = str(ROOT / "tasks")
    """task folder (or KernelBench level folder) that task ids are resolved against; on the CPU, unless given, the
    CPU-sized copies in tests/tasks/"""
    correct_trials: int = 5
    """fresh random input sets the candidate must match the reference on"""
    atol: float | None = None
    """absolute tolerance, for every dtype (default: the rules' own; kevin: 1e-2, the KernelBench version Kevin
    used; kernelbench: KernelBench's per dtype, 1e-4 for fp32 and 1e-2 for fp16/bf16)"""
    rtol: float | None = None
    """relative tolerance, for every dtype (default: the rules' own, as for --atol)"""
    timing_trials: int = 100
    """timed runs per model at most (never fewer than 10; fewer once timing is as precise as --timing-precision asks
    or --timing-budget-s runs out); on a GPU every other one runs under the kernel log and is checked, and the rest
    are reported (so at least 2 there)"""
    timing_precision: float = 0.01
    """timing stops once every median the speedup is made of is known to within this share of itself (half the
    width of its 95% interval, from the order statistics of its runs); 0 runs every --timing-trials run"""
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
    """torch's intra-op threads in the judge and the runner, for the reference and the candidate alike (at::parallel_for
    draws on the same pool): fixed, so that a CPU speedup does not hang on how many cores happen to be free; 1
    is the count that other work on the machine disturbs least"""
    seed: int = 42
    """seed set before get_init_inputs and before building each model (KernelBench's convention)"""
    compile_workers: int = len(os.sched_getaffinity(0))
    """candidates built at once"""
    spare_children: int = 3
    """judge and runner pairs started ahead on each GPU, no more than there are candidates left: each sets itself up
    (CUDA context, torch._dynamo: seconds) while the candidates before it run (about a second each once built)"""
    compile_timeout_s: float = 900.0
    """wall-clock limit for building one candidate"""
    run_timeout_s: float = 180.0
    """wall-clock limit for checking and timing one candidate (KernelBench's batch scripts: 180 s)"""
    build_dir: str = str(ROOT / ".cache" / "builds")
    """where extensions are built, one folder per distinct extension (kept: a cache across runs)"""
    sandbox: str = "auto"
    """box in the children that run candidate code (kevin/sandbox.py): 'auto' applies what the kernel offers and
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
    ray: str | None = None
    """address of a Ray cluster (host:port, or 'auto': the one this machine joined with `ray start`) whose nodes
    evaluate the candidates: an evaluator like this one per GPU of every node (per node without GPUs, building on
    the node's CPUs), builds shipped between nodes, not repeated (kevin/ray_pool.py, docs/cluster.md)"""
    copy_parameters: bool = False
    """copy the reference's parameters and buffers into ModelNew (where a shape occurs once on each side) before
    judging: the kernel judged apart from how ModelNew initialised its weights"""

    def __post_init__(self):
        """Every value checked once, here: a trial count of 0 would skip the check it counts (a wrong kernel
        "correct") or leave nothing to time; the first bad value is the error."""
        check(self, {"device": one_of("cuda", "cpu", "auto"), "sandbox": one_of("off", "auto", "strict"),
                     "rules": one_of(*RULE_PROFILES),
                     "gpus": ("be GPU ids like 0,1", lambda gpus: bool(gpus) and all(
                         isinstance(g, int) and g >= 0 for g in gpus)),
                     **dict.fromkeys(("correct_trials", "timing_trials", "cpu_threads", "compile_workers",
                                      "repeat_runs"), AT_LEAST_1),
                     **dict.fromkeys(("atol", "rtol", "timing_budget_s", "timing_precision", "warmup", "poison_bytes",
                                      "spare_children", "repeat_tolerance"), NOT_NEGATIVE),
                     "compile_timeout_s": POSITIVE, "run_timeout_s": POSITIVE,
                     "min_own_kernel_share": SHARE, "max_copy_share": SHARE,
                     "max_reference_slowdown": ("be at least 1", lambda value: value >= 1)})
        if self.ray is not None and self.gpus is not None:
            raise ValueError("--gpus picks GPUs of this machine; with --ray every GPU of the cluster evaluates")


# ----------------------------------------------------------------------------------------------------
# The tolerances the judge compares with (kevin/judge.py decides; kevin/runner.py runs the candidate)


def tolerances(cfg: EvalConfig) -> dict[str, list[float]]:
    """[atol, rtol] per output dtype ('other': the rest): the flags where given, else the rules' own."""
    own = RULE_PROFILES[cfg.rules].tolerance
    return {dtype: [own[dtype] if cfg.atol is None else cfg.atol, own[dtype] if cfg.rtol is None else cfg.rtol]
            for dtype in own}


# ----------------------------------------------------------------------------------------------------
# Feedback


# The finest time either timer tells apart: CUDA events resolve about 0.5 us (perf_counter, on the CPU, far
# finer). A median below it cannot be told from zero, so both times are floored at it: a kernel too fast to
# time gets a large but finite speedup ("at least this fast"), never an infinite one.
TIMER_RESOLUTION_MS = 5e-4


def speedup(reference_ms: float, candidate_ms: float) -> float:
    """reference / candidate, each floored at TIMER_RESOLUTION_MS; 0.0 (no credit) if either is not a finite
    number, which no timer gives."""
    if not (math.isfinite(reference_ms) and math.isfinite(candidate_ms)):
        return 0.0
    return max(reference_ms, TIMER_RESOLUTION_MS) / max(candidate_ms, TIMER_RESOLUTION_MS)


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
    """Turn what a build or run child sent back into an eval record with the text the model reads (and the GPU or
    host memory its evaluation took, where the judge measured it)."""
    result = _feedback(outcome, build_root=build_root, candidate_path=candidate_path, timeout_s=timeout_s, rules=rules)
    if outcome.get("memory_mib"):
        result["memory_mib"] = outcome["memory_mib"]
    return result


def _feedback(outcome: dict, *, build_root: str, candidate_path: str, timeout_s: float, rules: str) -> dict:
    if "no_room" in outcome:
        return make_result("runtime_error", f"Not evaluated (no fault of the kernel's): {outcome['no_room']}.",
                           not_evaluated=True)
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
        memory = outcome.get("memory_mib") or {}
        if outcome["error"].startswith("OutOfMemoryError") and "candidate_limit" in memory:
            message += (f"\nYour process may hold {memory['candidate_limit']:.0f} MiB of GPU memory: the task's "
                        f"footprint ({memory['footprint']:.0f} MiB: its inputs, outputs and working memory) and "
                        f"{memory['candidate_limit'] - memory['footprint']:.0f} MiB more.")
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
        f"a speedup of {ratio:.2f}x" + charged(outcome) + ". It can be made faster.",
        runtime_ms=cand, ref_runtime_ms=ref, speedup=ratio, max_abs_diff=outcome["max_abs_diff"],
        max_rel_diff=outcome.get("max_rel_diff"),
        time_s=outcome["times"], timing_trials=outcome["trials"], own_kernel_share=outcome["own_kernel_share"],
        between_calls_ms=outcome.get("between_calls_ms"), unreported_ms=outcome.get("unreported_ms"),
        floor_allowance_ms=outcome.get("floor_allowance_ms"), **extra)


def charged(outcome: dict) -> str:
    """What of the candidate's time the judge added to what its CUDA events reported, said in its feedback."""
    parts = [f"{outcome['between_calls_ms']:.3g} ms is GPU work it did between its timed calls"]\
        if outcome.get("between_calls_ms") else []
    if (unreported := (outcome.get("unreported_ms") or 0.0) - (outcome.get("floor_allowance_ms") or 0.0)) > 0:
        parts.append(f"{unreported:.3g} ms is time the judge's own clock saw each call take beyond what its CUDA "
                     "events reported")
    return f" (of that time, {' and '.join(parts)})" if parts else ""


# ----------------------------------------------------------------------------------------------------
# The scheduler


def resolve_device(cfg: EvalConfig) -> tuple[str, list[str]]:
    """('cuda' or 'cpu', the torch devices that run candidates, one worker each; with --ray, one name per pool of the
    cluster's)."""
    if cfg.ray:
        from kevin.ray_pool import cluster_device

        return cluster_device(cfg)
    kind = cfg.device
    if kind == "auto":
        kind = "cuda" if torch.cuda.device_count() > 0 else "cpu"
    if kind == "cpu":
        return "cpu", ["cpu"]
    count = torch.cuda.device_count()
    if count == 0:
        raise SystemExit("error: --device cuda, but no CUDA GPU is visible (--device cpu checks C++ candidates on the "
                         "CPU)")
    gpus = cfg.gpus if cfg.gpus is not None else list(range(count))
    if not gpus or any(g < 0 or g >= count for g in gpus):
        raise SystemExit(f"error: asked for GPUs {gpus} but {count} are visible")
    return "cuda", [f"cuda:{g}" for g in gpus]


def evaluate(records: list[dict], cfg: EvalConfig | None = None, on_result=None) -> list[dict]:
    """Evaluate many candidates at once; returns one eval dict per record, in order.

    Each record has `task` (an id under cfg.tasks, or a task file) and `code` (a candidate or a whole
    reply). `on_result(index, result)` is called as each finishes. Identical (task, code) pairs are
    evaluated once and share the result."""
    results: list[dict | None] = [None] * len(records)
    with open_evaluator(cfg or EvalConfig(), [str(r.get("task", "")) for r in records],
                        on_result=on_result) as evaluator:
        evaluator.submit(records, range(len(records)))
        left = len(records)
        while left:
            for i, result in evaluator.wait():
                results[i] = result
                left -= 1
    return results


def open_evaluator(cfg: EvalConfig, tasks: list[str], expected: int = 0, on_result=None):
    """An `Evaluator` on this machine, or with --ray its stand-in that hands the candidates to the cluster's nodes
    (kevin/ray_pool.py: Ray is imported there, in that mode only)."""
    if cfg.ray:
        from kevin.ray_pool import ClusterEvaluator

        return ClusterEvaluator(cfg, tasks, expected, on_result)
    return Evaluator(cfg, tasks, expected, on_result)


SANDBOX_RULE = ("[sandbox] the candidate made a system call the sandbox forbids (a network socket, ptrace, "
                "another process's memory, mount or namespaces, starting a process or running a program) and was "
                "killed")


def _number(value) -> float:
    """A number a child reported, or 0.0 where it reported none (or something else)."""
    return float(value) if isinstance(value, (int, float)) and math.isfinite(value) else 0.0


# The least own-kernel share under the kernelbench rules: any at all, i.e. your kernels must run.
KERNELS_MUST_RUN = 1e-9


def own_kernel_share_needed(cfg: EvalConfig) -> float:
    """The share the profiler holds the candidate to: --min-own-kernel-share under kevin; under kernelbench, whose
    candidates may leave the heavy op to PyTorch, only that its kernels run (unless the check is off)."""
    if not RULE_PROFILES[cfg.rules].torch_allowed or cfg.min_own_kernel_share == 0:
        return cfg.min_own_kernel_share
    return KERNELS_MUST_RUN


def _run_payload(cfg: EvalConfig, task_path: str, candidate: str, kernels: list[str], device: str) -> dict:
    """What the judge and the runner get: the files, the device and every setting of the check and the timing."""
    return {"task": task_path, "candidate": candidate, "device": device, "seed": cfg.seed,
            "correct_trials": cfg.correct_trials, "tolerance": tolerances(cfg),
            "timing_trials": cfg.timing_trials, "timing_budget_s": cfg.timing_budget_s,
            "timing_precision": cfg.timing_precision,
            "warmup": cfg.warmup, "compile_baseline": cfg.compile_baseline,
            "min_own_kernel_share": own_kernel_share_needed(cfg), "poison_bytes": cfg.poison_bytes,
            "defences": cfg.defences, "cpu_threads": cfg.cpu_threads, "kernel_names": kernels,
            "max_copy_share": cfg.max_copy_share, "repeat_runs": cfg.repeat_runs,
            "repeat_tolerance": cfg.repeat_tolerance, "copy_parameters": cfg.copy_parameters,
            "max_reference_slowdown": cfg.max_reference_slowdown}


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


class Busy:
    """Wall seconds during which at least one job of a kind was under way: jobs that overlap count once, so that
    the build and the check phases of a rollout can be set beside its wall time."""

    def __init__(self):
        self.seconds, self.running, self.since = 0.0, 0, 0.0
        self.lock = threading.Lock()

    @contextlib.contextmanager
    def __call__(self):
        with self.lock:
            if not self.running:
                self.since = time.perf_counter()
            self.running += 1
        try:
            yield
        finally:
            with self.lock:
                self.running -= 1
                if not self.running:
                    self.seconds += time.perf_counter() - self.since


class Evaluator:
    """Candidates judged as they are submitted, so that a caller can go on (generate the next turn of the
    trajectories already judged) while the others build and run: the static rules at once, every distinct
    candidate of a submission imported in a build child (one thread each), whose extensions the build cache
    compiles, at most cfg.compile_workers at once, and one thread per device that runs each built candidate in
    a fresh child set up ahead. `evaluate` is one submission.

    `tasks`: every task the submissions will name (ids or files), whose folders the children may read;
    `expected`: how many records later submissions will still bring, at most: while any may come, a judge and
    runner pair is kept set up for the next. Results come back from `wait` (and to `on_result(tag, result)`, in
    the thread that finished it). Leaving the `with` waits for every thread; after an error or a Ctrl-C it stops
    every child first. `shipped_builds`: on a cluster, the build cache's link to the other nodes' builds
    (kevin/ray_pool.py)."""

    def __init__(self, cfg: EvalConfig, tasks: list[str], expected: int = 0, on_result=None, shipped_builds=None):
        self.cfg, self.expected, self.on_result = cfg, expected, on_result
        self.shipped_builds = shipped_builds
        self.kind, self.devices = resolve_device(cfg)
        self.mechanisms = sandbox_mechanisms(cfg.sandbox)
        self.index = index_tasks(cfg.tasks) if Path(cfg.tasks).exists() else {}
        self.build_root = str(Path(cfg.build_dir).resolve())
        Path(self.build_root).mkdir(parents=True, exist_ok=True)
        self.folders = {str(path.parent) for path in self.task_paths(tasks)}
        self.lock = threading.Lock()
        self.ready: queue.Queue = queue.Queue()  # built candidates, for the device threads
        self.finished: queue.Queue = queue.Queue()  # (tag, result), or the error of a thread that failed
        self.to_run = 0  # distinct candidates submitted that may still reach a device
        self.stopping = False  # interrupted: what children say from now on is no result
        self.builds: list[threading.Thread] = []
        self.workers: list[threading.Thread] = []
        self.candidates, self.compiles = itertools.count(), itertools.count()
        self.busy = {"build": Busy(), "check": Busy()}
        self.progress = None

    def task_paths(self, tasks: list[str]) -> list[Path]:
        """The task files of those that resolve (a record naming any other is a format error)."""
        paths = []
        for task in tasks:
            try:
                paths.append(resolve_task(task, self.index))
            except ValueError:
                pass
        return paths

    def __enter__(self) -> Evaluator:
        """The fork server, the children's settings and the build cache, then what `__exit__` cleans up: the work
        folder and the progress bar (a Ctrl-C before them leaves nothing behind)."""
        start_fork_server()  # from this thread, before the threads that start children
        readable = sandbox.readable([self.build_root, str(ROOT), self.cfg.tasks, *sorted(self.folders)],
                                    hidden_from_children())
        self.timing_cores, others = timing_cores(self.devices, list(os.sched_getaffinity(0)),
                                                 gpus_on_machine() if self.kind == "cuda" else 0,
                                                 os.environ.get("CUDA_VISIBLE_DEVICES"))
        self.settings = {kind: replace(settings, cores=others)
                         for kind, settings in child_settings(self.kind, readable, self.mechanisms).items()}
        self.cache = BuildCache(Path(self.build_root), self.settings["run"].env.get("TORCH_CUDA_ARCH_LIST", ""),
                                self.cfg.compile_workers, self.compile, self.cfg.compile_timeout_s,
                                self.shipped_builds)
        self.workdir = tempfile.mkdtemp(prefix="eval-", dir=self.build_root)
        if self.cfg.progress:
            from tqdm import tqdm

            self.progress = tqdm(total=0, desc=f"evaluate ({self.kind} x{len(self.devices)})", file=sys.stderr)
        return self

    def __exit__(self, kind, error, trace) -> None:
        try:
            if kind is not None:
                self.stop()
            else:
                try:
                    self.close()
                except BaseException:  # a Ctrl-C while waiting
                    self.stop()
                    raise
        finally:
            if self.progress is not None:
                self.progress.close()
            shutil.rmtree(self.workdir, ignore_errors=True)

    def submit(self, records: list[dict], tags) -> None:
        """Judge `records`; each one's result comes back with its tag. Records without a valid candidate are
        finished here; the others are built at once, then run as a device is free."""
        records, tags = list(records), list(tags)
        jobs = self.write_candidates(self.apply_static_rules(records, tags))
        with self.lock:
            self.to_run += len(jobs)
            self.expected = max(0, self.expected - len(records))
        if self.progress is not None:
            self.progress.total += len(records)
            self.progress.refresh()
        if jobs and not self.workers:  # from the first candidate to run on: spares set up while it builds
            self.workers = [self.start_thread(self.run_queued, device) for device in self.devices]
        for job in jobs:  # one at a time: each is in `builds` for the stop as soon as it exists
            self.builds.append(self.start_thread(self.build, job))

    def wait(self) -> list[tuple]:
        """The (tag, result) pairs finished since the last call, at least one: blocks until there is one. The
        error of a thread of this evaluator that failed is raised here."""
        items = [self.finished.get()]
        while not self.finished.empty():
            items.append(self.finished.get())
        for item in items:
            if isinstance(item, Exception):
                raise item
        return items

    def seconds(self) -> dict[str, float]:
        """Wall seconds during which a candidate was being built, and during which one was being checked and timed."""
        return {name: busy.seconds for name, busy in self.busy.items()}

    def start_thread(self, target, *args) -> threading.Thread:
        """A daemon thread whose error reaches `wait`, quietly where a Ctrl-C's stop is what it failed on."""
        def guarded():
            try:
                target(*args)
            except Exception as error:
                if not self.stopping:
                    self.finished.put(error)

        thread = threading.Thread(target=guarded, daemon=True)
        thread.start()
        return thread

    def close(self) -> None:
        """Once every submission is in: wait for the builds, then tell the device threads to stop after the last."""
        for thread in self.builds:
            thread.join()
        for _ in self.workers:
            self.ready.put(None)
        for thread in self.workers:
            thread.join()

    def stop(self) -> None:
        """On Ctrl-C: no result from here on (a child this stop kills would read as a crash), and every child
        killed until no thread waits on one; a second Ctrl-C does not cut that short."""
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
        with self.lock:
            self.stopping = True
        for _ in self.workers:
            self.ready.put(None)
        try:
            while any(thread.is_alive() for thread in self.builds + self.workers):
                stop_every_child()
                time.sleep(0.05)
        finally:
            signal.signal(signal.SIGINT, previous)

    def finish(self, tags: list, result: dict, submitted: float) -> None:
        """Hand `result` to every record of the candidate. Its `total` is the candidate's own time, its build and its
        check: the seconds since `submitted` less those it `queued` behind others (for a compile slot, a device)."""
        times = result.get("time_s", {})
        result["time_s"] = {**times, "total": round(time.perf_counter() - submitted - times.get("queued", 0.0), 3)}
        with self.lock:
            if self.stopping:
                return
            for tag in tags:
                own = dict(result, time_s=dict(result["time_s"]), rules=self.cfg.rules)
                self.finished.put((tag, own))
                if self.on_result:
                    self.on_result(tag, own)
            if self.progress is not None:
                self.progress.update(len(tags))

    def apply_static_rules(self, records: list[dict], tags: list) -> dict[tuple[str, str], list]:
        """Finish every record that has no valid candidate; group the others' tags by identical (task, code)."""
        groups: dict[tuple[str, str], list] = {}
        for tag, record in zip(tags, records):
            started = time.perf_counter()
            try:
                task_path = str(resolve_task(str(record["task"]), self.index))
            except (KeyError, ValueError) as e:
                self.finish([tag], make_result("format_error", f"Bad record: {e}"), started)
                continue
            code = extract_code(str(record.get("code") or ""))
            if not code or not code.strip():
                self.finish([tag], make_result("format_error", "Format error: the reply has no complete fenced "
                                               "code block with the solution (```python ... ```)."), started)
                continue
            verdict = static_check(code, self.kind, self.cfg.rules)
            if verdict:
                self.finish([tag], make_result(*verdict), started)
                continue
            groups.setdefault((task_path, code), []).append(tag)
        return groups

    def write_candidates(self, groups: dict[tuple[str, str], list]) -> list[tuple]:
        """Each distinct candidate in its own folder: (task file, candidate file, its kernels' names, tags)."""
        jobs = []
        for (task_path, code), tags in groups.items():
            folder = Path(self.workdir) / f"c{next(self.candidates):05d}"
            folder.mkdir()
            (folder / "solution.py").write_text(code)
            jobs.append((task_path, str(folder / "solution.py"), kernel_names(code), tags))
        return jobs

    def still_to_run(self, taken: int = 0) -> int:
        """How many judge and runner pairs may be needed (less `taken`, which a device now has): one per candidate
        submitted that may still reach a device, and one more while records are still expected."""
        with self.lock:
            self.to_run -= taken
            return self.to_run + min(self.expected, 1)

    def compile(self, payload: dict, writable: list[str], timeout_s: float) -> dict:
        """The build cache's compiler: one extension, in a compile child that may write only `writable`."""
        log = str(Path(self.workdir) / f"compile-{next(self.compiles)}.log")
        return run_in_child(compile_extension, payload, self.settings["compile"], timeout_s, log, writable)

    def build(self, job: tuple) -> None:
        """Import one candidate in a child, which has the cache build its extensions, then queue it for a
        device, or finish it as a build failure."""
        task_path, candidate, _, tags = job
        submitted = time.perf_counter()
        with self.cache.slot():
            slot_wait = time.perf_counter() - submitted  # behind the other candidates' builds
            if self.stopping:
                return
            with self.busy["build"]():
                outcome = run_in_child(build_candidate, {"candidate": candidate}, self.settings["build"],
                                       self.cfg.compile_timeout_s, str(Path(candidate).with_name("build.log")),
                                       serve=self.cache.request)
        outcome["cpu_s"] = _number(outcome.get("cpu_s")) + self.cache.compile_cpu_s()
        if not (outcome.get("timeout") or "crash" in outcome or "error" in outcome):
            self.ready.put((job, submitted, slot_wait, time.perf_counter(), _number(outcome.get("seconds")),
                            outcome["cpu_s"]))
            return
        self.still_to_run(taken=1)  # it will not reach a device
        result = _build_failure(outcome, candidate, self.build_root, self.cfg.compile_timeout_s,
                                time.perf_counter() - submitted - slot_wait, self.cfg.rules)
        result["time_s"]["queued"] = round(slot_wait, 3)
        self.finish(tags, result, submitted)

    def start_pair(self, device: str, logs) -> tuple:
        """A runner (sandboxed: it will import the candidate) and its judge (never imports candidate code),
        connected to each other, both setting themselves up until a candidate comes."""
        judge_end, runner_end = peers()
        runner = start_child(run, self.settings["run"], next(logs), device, peer=runner_end)
        return start_child(judge, self.settings["judge"], next(logs), device, peer=judge_end), runner

    def judge_candidate(self, pair: tuple, task_path: str, candidate: str, kernels: list[str],
                        device: str) -> tuple[dict, float | None]:
        """(the verdict, the runner's CPU seconds): the judge's, or where the runner died, timed out or was killed
        by the sandbox, what its exit says. The runner's own answer to this process is never read as a result, nor
        ends it: the judge alone does (a candidate that writes a forged answer here, then the judge's socket, is
        read there). Its CPU seconds are read from /proc as the judge ends, before it is stopped (None for one gone
        by then)."""
        judge_child, runner = pair
        cores = self.timing_cores.get(device)
        # the pair alone on two cores of its own while it judges, each waiting awake (`timing_cores`)
        pinned = bool(cores) and pin(judge_child[0].pid, {cores[0]}) and pin(runner[0].pid, {cores[1]})
        payload = {**_run_payload(self.cfg, task_path, candidate, kernels, device), "spin_waits": pinned}
        ran: dict = {}
        # the runner's own deadline comes after the judge's: a judge that times out reads the runner's CPU time
        # before it is stopped (with equal deadlines, a loaded host often stopped the runner first: no number)
        serving = threading.Thread(target=lambda: ran.update(finish_child(
            runner, payload, self.cfg.run_timeout_s + RUNNER_GRACE_S, serve=self.cache.request,
            stop_on_result=False)), daemon=True)
        serving.start()
        outcome = finish_child(judge_child, {**payload, "runner_pid": runner[0].pid}, self.cfg.run_timeout_s)
        cpu_s = cpu_seconds(runner[0].pid)
        if pinned:  # their exits (a CUDA context torn down) off the cores the next pair will time on
            for child in (judge_child, runner):
                pin(child[0].pid, self.settings["run"].cores)
        if outcome.get("timeout"):  # the judge waited on a runner that never answered
            stop_child(runner)
            return outcome, cpu_s
        if outcome.get("runner_gone"):  # what the runner's exit says, or its own last word (it can only fail)
            serving.join(timeout=5.0)
            outcome = {**ran, "ready_at": outcome.get("ready_at")} if {"crash", "timeout", "error"} & ran.keys() \
                else {"crash": "the process exited before it answered", "log": ""}
        stop_child_later(runner)
        return outcome, cpu_s

    def run_queued(self, device: str) -> None:
        """Each candidate gets a fresh runner and judge, set up ahead (no more spares than candidates that may
        still come); the oldest spare has had the longest to get ready."""
        if self.stopping:  # a Ctrl-C overtook this thread's start: the stop did not count it alive, so it
            return  # may already have removed the work folder
        logs = (str(Path(self.workdir) / f"run-{device.replace(':', '')}-{n}.log") for n in itertools.count())
        spares = collections.deque(self.start_pair(device, logs)
                                   for _ in range(min(self.cfg.spare_children, self.still_to_run())))
        while (item := self.ready.get()) is not None and not self.stopping:
            left = self.still_to_run(taken=1)
            (task_path, candidate, kernels, tags), submitted, slot_wait, built_at, build_s, build_cpu_s = item
            pair = spares.popleft() if spares else None
            if pair is None or not all(child[0].is_alive() for child in pair):
                pair = self.start_pair(device, logs)
            if len(spares) < min(self.cfg.spare_children, left):
                spares.append(self.start_pair(device, logs))
            run_started, sent_at = time.perf_counter(), time.time()
            queued = slot_wait + run_started - built_at  # behind the candidates checked before it
            with self.busy["check"]():
                outcome, run_cpu_s = self.judge_candidate(pair, task_path, candidate, kernels, device)
            result = build_feedback(outcome, build_root=self.build_root, candidate_path=candidate,
                                    timeout_s=self.cfg.run_timeout_s, rules=self.cfg.rules)
            times = {k: round(v, 3) for k, v in result["time_s"].items()}
            waited = max(0.0, _number(outcome.get("ready_at", sent_at)) - sent_at)  # the judge was still setting up
            result["time_s"] = {"compile": round(build_s, 3), "queued": round(queued, 3),
                                "run": round(time.perf_counter() - run_started, 3), "wait": round(waited, 3), **times}
            result["cpu_s"] = {"compile": round(build_cpu_s, 3),
                               "run": None if run_cpu_s is None else round(run_cpu_s, 3)}
            self.finish(tags, result, submitted)
        for pair in spares:
            for child in pair:
                stop_child_later(child)
