"""Evaluation throughput: kernels per minute of evaluate.py against plain load_inline builds, in one run.

The same candidate set is evaluated twice:
  (a) baseline: every candidate built with a plain `load_inline` (its own extensions folder) in a process
      pool as wide as the cores, as KernelBench's build cache does, then checked and timed one after
      another, each in a fresh process (5 correctness trials, 3 warm-ups, 100 timed runs with CUDA events);
  (b) `evaluate.evaluate` with every defence on, into an empty build folder (no cache from earlier runs).
It prints kernels per minute of each and their ratio, median and p90 build seconds per kernel, the share
of (b)'s wall time a GPU worker was busy, seconds per kernel by phase, and whether both gave the same
statuses.

The set: for every correct hand-written kernel in solutions/<device>/, four variants, as a GRPO group
produces them: the kernel, a copy whose extension has another name (a distinct build), a copy with a
compile error, and an exact duplicate.

    python bench/eval_throughput.py                      # on the GPU machine
    python bench/eval_throughput.py --device cpu --tasks tests/tasks   # the same machinery on a CPU
"""
import argparse
import json
import multiprocessing as mp
import os
import re
import statistics
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import evaluate as ev  # noqa: E402


def variants(record: dict) -> list[dict]:
    """The kernel, a renamed copy, a copy that does not compile, an exact duplicate."""
    code = record["code"]
    renamed = "# a second attempt\n" + re.sub(r'name="(\w+)"', r'name="\1_again"', code, count=1)
    broken = re.sub(r'(source = r?""")', r'\1\nstatic int broken = ;', code, count=1)
    return [{**record, "code": c, "variant": v} for v, c in
            (("kernel", code), ("renamed", renamed), ("compile_error", broken), ("duplicate", code))]


def baseline_build(code: str, folder: str) -> float:
    """Build one candidate as a plain load_inline would, in its own extensions folder; seconds or -1."""
    os.environ["TORCH_EXTENSIONS_DIR"] = folder
    path = Path(folder) / "candidate.py"
    path.write_text(code)
    start = time.perf_counter()
    try:
        ev._import_file(str(path), "candidate")
    except Exception:  # noqa: BLE001 - a failed build is a result here
        return -1.0
    return time.perf_counter() - start


def baseline_case(task: str, folder: str, device: str) -> dict:
    """KernelBench-style check and timing of one built candidate, in a fresh process."""
    os.environ["TORCH_EXTENSIONS_DIR"] = folder
    import torch

    try:
        module = ev._import_file(str(Path(folder) / "candidate.py"), "candidate")
        spec = ev._import_file(task, "reference_task")
        torch.manual_seed(42)
        init = spec.get_init_inputs()
        torch.manual_seed(42)
        reference = spec.Model(*init).to(device)
        torch.manual_seed(42)
        model = module.ModelNew(*init).to(device)
        with torch.no_grad():
            for trial in range(5):
                torch.manual_seed(trial)
                inputs = [x.to(device) if isinstance(x, torch.Tensor) else x for x in spec.get_inputs()]
                expected, out = reference(*inputs), model(*inputs)
                if out.shape != expected.shape or not torch.allclose(out, expected, atol=1e-2, rtol=1e-2):
                    return {"status": "incorrect"}
            times = {}
            for name, fn in (("candidate", model), ("reference", reference)):
                samples = []
                for i in range(103):
                    if device == "cpu":
                        start = time.perf_counter()
                        fn(*inputs)
                        samples.append((time.perf_counter() - start) * 1e3)
                        continue
                    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    begin.record()
                    fn(*inputs)
                    end.record()
                    torch.cuda.synchronize()
                    samples.append(begin.elapsed_time(end))
                times[name] = statistics.median(samples[3:])
        return {"status": "correct", "speedup": times["reference"] / times["candidate"]}
    except Exception:  # noqa: BLE001
        return {"status": "runtime_error"}


def run_baseline(records: list[dict], tasks: dict, device: str, workdir: Path) -> dict:
    folders = [str(workdir / f"a{i:04d}") for i in range(len(records))]
    for folder in folders:
        Path(folder).mkdir()
    spawn = mp.get_context("spawn")
    start = time.perf_counter()
    with ProcessPoolExecutor(os.cpu_count(), mp_context=spawn) as pool:
        build_s = list(pool.map(baseline_build, [r["code"] for r in records], folders))
    built = time.perf_counter()
    statuses = []
    for record, folder, seconds in zip(records, folders, build_s):
        if seconds < 0:
            statuses.append({"status": "compile_error"})
            continue
        with ProcessPoolExecutor(1, mp_context=spawn) as one:  # one fresh process per case
            statuses.append(one.submit(baseline_case, str(ev.resolve_task(record["task"], tasks)), folder,
                                       device).result())
    end = time.perf_counter()
    return {"wall_s": end - start, "build_wall_s": built - start, "check_wall_s": end - built,
            "build_s": [s for s in build_s if s >= 0], "results": statuses}


def run_evaluator(records: list[dict], cfg: ev.EvalConfig) -> dict:
    start = time.perf_counter()
    results = ev.evaluate(records, cfg)
    wall = time.perf_counter() - start
    phases = {}
    for r in results:
        for phase, seconds in r["time_s"].items():
            if phase != "total":
                phases[phase] = phases.get(phase, 0.0) + seconds
    run_s = sum(phases.get(p, 0.0) for p in ("load", "correctness", "timing"))
    return {"wall_s": wall, "results": results, "build_s": [r["time_s"]["compile"] for r in results
                                                            if r["time_s"].get("compile", 0) > 0.5],
            "phase_s_per_kernel": {p: s / len(results) for p, s in phases.items()},
            "gpu_busy_share": run_s / wall / max(1, len(ev.resolve_device(cfg)[1]))}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="auto", help="cuda, cpu or auto")
    p.add_argument("--tasks", default=None, help="task folder (default: tasks/, or tests/tasks/ on a CPU)")
    p.add_argument("--out", help="write every number to this JSON file")
    args = p.parse_args()

    kind, _ = ev.resolve_device(ev.EvalConfig(device=args.device))
    tasks_dir = args.tasks or str(ev.ROOT / ("tasks" if kind == "cuda" else "tests/tasks"))
    tasks = ev.load_tasks(tasks_dir)
    kernels = [r for r in ev.library_records(ev.ROOT / "solutions" / kind) if ".correct_" in r["solution"]]
    records = [v for r in kernels for v in variants(r)]
    print(f"{len(records)} candidates over {len(kernels)} tasks, {os.cpu_count()} cores, {kind}", file=sys.stderr)

    with tempfile.TemporaryDirectory() as baseline_dir, tempfile.TemporaryDirectory() as build_dir:
        baseline = run_baseline(records, tasks, "cuda" if kind == "cuda" else "cpu", Path(baseline_dir))
        ours = run_evaluator(records, ev.EvalConfig(device=kind, tasks=tasks_dir, build_dir=build_dir))

    def per_minute(run: dict) -> float:
        return len(records) / run["wall_s"] * 60

    def p90(values: list[float]) -> float:
        return sorted(values)[int(0.9 * (len(values) - 1))] if values else float("nan")

    mismatches = [(r["solution"], r["variant"], a["status"], b["status"])
                  for r, a, b in zip(records, baseline["results"], ours["results"]) if a["status"] != b["status"]]
    print("| | kernels/min | wall s | build s median | build s p90 |\n|---|---|---|---|---|")
    for name, run in (("(a) plain load_inline pool, then one by one", baseline), ("(b) evaluate.py", ours)):
        print(f"| {name} | {per_minute(run):.1f} | {run['wall_s']:.0f} | "
              f"{statistics.median(run['build_s'] or [float('nan')]):.1f} | {p90(run['build_s']):.1f} |")
    print(f"\nratio (b)/(a): {per_minute(ours) / per_minute(baseline):.2f}x; baseline: {baseline['build_wall_s']:.0f} s "
          f"building, {baseline['check_wall_s']:.0f} s checking; (b) GPU-busy share {ours['gpu_busy_share']:.0%}")
    print("(b) seconds per kernel by phase: " + ", ".join(f"{k} {v:.2f}" for k, v in ours["phase_s_per_kernel"].items()))
    print(f"same statuses: {len(records) - len(mismatches)}/{len(records)}" +
          "".join(f"\n  {s} [{v}]: baseline {a}, evaluate.py {b}" for s, v, a, b in mismatches))
    if args.out:
        Path(args.out).write_text(json.dumps({"device": kind, "candidates": len(records), "baseline": {
            k: v for k, v in baseline.items() if k != "results"}, "evaluate": {k: v for k, v in ours.items()
                                                                                  if k != "results"},
            "mismatches": mismatches}, indent=1))


if __name__ == "__main__":
    main()
