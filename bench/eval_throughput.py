"""Evaluation throughput: kernels per minute of evaluate.py against plain load_inline builds, in one run.

The same candidate set is evaluated twice:
  (a) baseline: every candidate built with a plain `load_inline` (its own extensions folder) in a process
      pool as wide as the cores, as KernelBench's build cache does, then checked and timed one after
      another in one process (5 correctness trials, 3 warm-ups, 100 timed runs with CUDA events);
  (b) `evaluate.evaluate` with every defence on, into an empty build folder (no cache from earlier runs,
      its precompiled header included).
Inputs are made on the device in both, so the comparison is about building and scheduling. It prints
kernels per minute of each and their ratio, median and p90 build seconds per kernel, the share of (b)'s
wall time a GPU was busy, CPU-seconds per kernel by phase, and whether both gave the same statuses and
speedups.

The set: the first correct hand-written kernel of every task in solutions/<device>/, written as models
write them (the CUDA source starts with `#include <torch/extension.h>`, as in KernelBench's example), in
four variants as a GRPO group produces them: the kernel, a second attempt with another extension name (a
distinct build), a copy with a compile error, and an exact duplicate.

    python bench/eval_throughput.py --out results/eval_throughput_h200.json    # (a), then (b), then the report
    python bench/eval_throughput.py --part baseline --save a.json               # the same in steps, e.g. where one
    python bench/eval_throughput.py --part evaluate --save b.json               #   command may run 10 minutes at most
    python bench/eval_throughput.py --report a.json b.json --out results/eval_throughput_h200.json
    python bench/eval_throughput.py --device cpu                                 # the same machinery on a CPU
    python bench/eval_throughput.py --part evaluate --tree .old --save before.json  # an older checkout's evaluator
    python bench/eval_throughput.py --part evaluate --ray auto --save ray.json  # (b) through a Ray cluster (its
                                                                                #   overhead, on a one-node one)
"""
import argparse
import json
import multiprocessing as mp
import os
import re
import resource
import statistics
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from tqdm import tqdm

# --tree DIR: evaluate with another checkout's evaluator (an older one, say) on this checkout's candidates.
CANDIDATES = Path(__file__).resolve().parents[1]
TREE = Path(sys.argv[sys.argv.index("--tree") + 1]).resolve() if "--tree" in sys.argv else CANDIDATES
sys.path.insert(0, str(TREE))
import evaluate as ev  # noqa: E402

try:
    from kevin.harness import import_file  # noqa: E402
except ImportError:  # an older tree's: kevin/run_child.py, or before it evaluate.py
    try:
        from kevin.run_child import import_file  # noqa: E402
    except ImportError:
        from evaluate import import_file  # noqa: E402


def variants(record: dict) -> list[dict]:
    """The kernel as a model writes it, a renamed second attempt, a copy that does not compile, a duplicate."""
    code = re.sub(r'(cuda_source = r?""")', r"\1\n#include <torch/extension.h>", record["code"], count=1)
    renamed = "# a second attempt\n" + re.sub(r'name="(\w+)"', r'name="\1_again"', code, count=1)
    broken = re.sub(r'(source = r?""")', r'\1\nstatic int broken = ;', code, count=1)
    return [{**record, "code": c, "variant": v} for v, c in
            (("kernel", code), ("renamed", renamed), ("compile_error", broken), ("duplicate", code))]


def cpu_seconds() -> float:
    """CPU time of this process and of every child it has waited for (ninja, nvcc, gcc)."""
    usage = [resource.getrusage(who) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)]
    return sum(u.ru_utime + u.ru_stime for u in usage)


def as_in_a_fresh_process(folder: str) -> None:
    """Point load_inline at the candidate's own folder and forget the extensions loaded before: torch renames one
    loaded again from another folder under the same name (name_v1) and builds it anew, which a process per
    candidate, as KernelBench uses, would not."""
    import torch.utils.cpp_extension as cpp_ext

    os.environ["TORCH_EXTENSIONS_DIR"] = folder
    cpp_ext.JIT_EXTENSION_VERSIONER.entries.clear()


def baseline_build(code: str, folder: str) -> tuple[float, float]:
    """Build one candidate as a plain load_inline would, in its own extensions folder: (seconds, CPU-seconds);
    seconds is -1 when it does not build."""
    as_in_a_fresh_process(folder)
    path = Path(folder) / "candidate.py"
    path.write_text(code)
    start, cpu = time.perf_counter(), cpu_seconds()
    try:
        import_file(str(path), "candidate")
    except Exception:  # noqa: BLE001 - a failed build is a result here
        return -1.0, cpu_seconds() - cpu
    return time.perf_counter() - start, cpu_seconds() - cpu


def baseline_checks(cases: list[tuple[str, str]], device: str) -> list[dict]:
    """KernelBench-style check and timing of each built candidate, one after another, in this process."""
    import torch

    def inputs_for(spec, seed: int) -> list:
        torch.manual_seed(seed)
        with torch.device(device):
            return [x.to(device) if isinstance(x, torch.Tensor) else x for x in spec.get_inputs()]

    def milliseconds(fn, inputs: list) -> float:
        if device == "cpu":
            start = time.perf_counter()
            fn(*inputs)
            return (time.perf_counter() - start) * 1e3
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        fn(*inputs)
        end.record()
        torch.cuda.synchronize()
        return begin.elapsed_time(end)

    results = []
    for task, folder in tqdm(cases, desc="(a) checking", unit="kernel", file=sys.stderr):
        as_in_a_fresh_process(folder)
        try:
            module = import_file(str(Path(folder) / "candidate.py"), "candidate")
            spec = import_file(task, "reference_task")
            torch.manual_seed(42)
            init = spec.get_init_inputs()
            torch.manual_seed(42)
            reference = spec.Model(*init).to(device)
            torch.manual_seed(42)
            model = module.ModelNew(*init).to(device)
            with torch.no_grad():
                for trial in range(5):
                    inputs = inputs_for(spec, trial)
                    expected, out = reference(*inputs), model(*inputs)
                    if out.shape != expected.shape or not torch.allclose(out, expected, atol=1e-2, rtol=1e-2):
                        results.append({"status": "incorrect"})
                        break
                else:
                    times = {name: statistics.median([milliseconds(fn, inputs) for _ in range(103)][3:])
                             for name, fn in (("candidate", model), ("reference", reference))}
                    results.append({"status": "correct", "speedup": times["reference"] / times["candidate"]})
            del module, model, reference
        except Exception:  # noqa: BLE001
            results.append({"status": "runtime_error"})
    return results


def run_baseline(records: list[dict], tasks: dict, device: str, workdir: Path, cores: int) -> dict:
    folders = [str(workdir / f"a{i:04d}") for i in range(len(records))]
    for folder in folders:
        Path(folder).mkdir()
    spawn = mp.get_context("spawn")
    start = time.perf_counter()
    with ProcessPoolExecutor(cores, mp_context=spawn) as pool:
        builds = list(tqdm(pool.map(baseline_build, [r["code"] for r in records], folders), total=len(records),
                           desc="(a) building", unit="kernel", file=sys.stderr))
    built = time.perf_counter()
    cases = [(str(ev.resolve_task(r["task"], tasks)), folder)
             for r, folder, (seconds, _) in zip(records, folders, builds) if seconds >= 0]
    with ProcessPoolExecutor(1, mp_context=spawn) as one:  # a fresh process that has not built anything
        checked = iter(one.submit(baseline_checks, cases, device).result())
    end = time.perf_counter()
    results = [next(checked) if seconds >= 0 else {"status": "compile_error"} for seconds, _ in builds]
    return {"wall_s": end - start, "build_wall_s": built - start, "check_wall_s": end - built,
            "build_s": [s for s, _ in builds if s >= 0], "build_cpu_s_per_kernel": sum(c for _, c in builds) / len(records),
            "results": results}


def run_evaluator(records: list[dict], cfg: ev.EvalConfig) -> dict:
    start = time.perf_counter()
    results = ev.evaluate(records, cfg)
    wall = time.perf_counter() - start
    distinct = list({(r["task"], r["code"]): e for r, e in zip(records, results)}.values())  # duplicates share one
    built = [e for e in distinct if e["time_s"].get("compile", 0) > 0]
    cpu = {"compile": sum(e.get("cpu_s", {}).get("compile", 0) for e in distinct),
           "check and time": sum(e.get("cpu_s", {}).get("run") or 0 for e in distinct)}
    return {"wall_s": wall, "results": results, "build_s": [e["time_s"]["compile"] for e in built],
            "cpu_s_per_kernel": {phase: s / len(records) for phase, s in cpu.items()},
            "run_s_per_kernel": {p: sum(e["time_s"].get(p, 0) for e in distinct) / len(records)
                                 for p in ("run", "wait", "load", "correctness", "profile", "timing")},
            "gpu_busy_share": sum(e["time_s"].get("run", 0) - e["time_s"].get("wait", 0) for e in distinct)
                              / wall / len(ev.resolve_device(cfg)[1])}


def candidate_set(kind: str) -> list[dict]:
    firsts = {}
    for r in ev.library_records(CANDIDATES / "solutions" / kind):
        if ".correct_" in r["solution"]:
            firsts.setdefault(r["task"], r)
    return [v for r in firsts.values() for v in variants(r)]


def run_part(part: str, records: list[dict], kind: str, tasks_dir: str, ray: str | None = None) -> dict:
    """(a) or (b) on every core this process may use; (b) on every visible GPU, (a) on the first; with `ray`, (b) on
    the pools of that cluster, each building on its node's CPUs."""
    cores = len(os.sched_getaffinity(0))
    with tempfile.TemporaryDirectory() as workdir:
        if part == "baseline":
            device = "cpu" if kind == "cpu" else "cuda:0"
            return run_baseline(records, ev.index_tasks(tasks_dir), device, Path(workdir), cores)
        return run_evaluator(records, ev.EvalConfig(device=kind, tasks=tasks_dir, build_dir=workdir,
                                                    compile_workers=cores,  # an older --tree has no `ray`
                                                    **({"ray": ray} if ray else {})))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="auto", help="cuda, cpu or auto")
    p.add_argument("--tasks", default=None, help="task folder (default: tasks/, or tests/tasks/ on a CPU)")
    p.add_argument("--part", choices=["baseline", "evaluate"],
                   help="run only (a) or (b) and write its numbers to --save (the report then comes from --report)")
    p.add_argument("--save", help="with --part: the JSON file to write")
    p.add_argument("--report", nargs=2, metavar=("BASELINE_JSON", "EVALUATE_JSON"),
                   help="print the comparison of two --part files instead of running anything")
    p.add_argument("--out", help="write every number to this JSON file")
    p.add_argument("--tree", default=str(TREE), help="the checkout whose evaluate.py judges in (b) (default: this one); "
                   "the candidates are always this checkout's, so two trees can be compared on the same ones")
    p.add_argument("--ray", help="(b) through the Ray cluster at this address (or auto), started with `ray start "
                   "--head` on this machine: Ray's overhead against (b) alone (docs/cluster.md)")
    args = p.parse_args()
    if args.part and not args.save:
        p.error("--part needs --save")

    kind, gpus = ev.resolve_device(ev.EvalConfig(device=args.device))
    tasks_dir = args.tasks or str(CANDIDATES / ("tasks" if kind == "cuda" else "tests/tasks"))
    records = candidate_set(kind)
    cores = len(os.sched_getaffinity(0))
    print(f"{len(records)} candidates over {len(records) // 4} tasks, {cores} cores, "
          f"{1 if kind == 'cpu' else len(gpus)} {kind} worker(s)", file=sys.stderr)
    if args.report:
        baseline, ours = (json.loads(Path(f).read_text()) for f in args.report)
    elif args.part:
        run = run_part(args.part, records, kind, tasks_dir, args.ray)
        Path(args.save).write_text(json.dumps(run))
        print(f"{args.part}: {len(records) / run['wall_s'] * 60:.1f} kernels/min ({run['wall_s']:.0f} s)")
        return
    else:
        baseline = run_part("baseline", records, kind, tasks_dir)
        ours = run_part("evaluate", records, kind, tasks_dir, args.ray)

    def per_minute(run: dict) -> float:
        return len(records) / run["wall_s"] * 60

    def p90(values: list[float]) -> float:
        return sorted(values)[int(0.9 * (len(values) - 1))] if values else float("nan")

    mismatches = [(r["solution"], r["variant"], a["status"], b["status"])
                  for r, a, b in zip(records, baseline["results"], ours["results"]) if a["status"] != b["status"]]
    ratios = [b["speedup"] / a["speedup"] for a, b in zip(baseline["results"], ours["results"])
              if a.get("speedup") and b.get("speedup")]
    print("| | kernels/min | wall s | build s median | build s p90 |\n|---|---|---|---|---|")
    for name, run in (("(a) plain load_inline pool, then one by one", baseline), ("(b) evaluate.py", ours)):
        print(f"| {name} | {per_minute(run):.1f} | {run['wall_s']:.0f} | "
              f"{statistics.median(run['build_s'] or [float('nan')]):.1f} | {p90(run['build_s']):.1f} |")
    print(f"\nratio (b)/(a): {per_minute(ours) / per_minute(baseline):.2f}x; baseline: {baseline['build_wall_s']:.0f} s "
          f"building, {baseline['check_wall_s']:.0f} s checking; (b) GPU-busy share {ours['gpu_busy_share']:.0%}")
    print(f"CPU-seconds per kernel: (a) building {baseline['build_cpu_s_per_kernel']:.1f}; (b) " +
          ", ".join(f"{k} {v:.1f}" for k, v in ours["cpu_s_per_kernel"].items()) +
          "; (b) wall seconds per kernel on the GPU worker: " +
          ", ".join(f"{k} {v:.2f}" for k, v in ours["run_s_per_kernel"].items()))
    print(f"same statuses: {len(records) - len(mismatches)}/{len(records)}" +
          "".join(f"\n  {s} [{v}]: baseline {a}, evaluate.py {b}" for s, v, a, b in mismatches))
    if ratios:
        print(f"speedup (b)/(a) over {len(ratios)} correct kernels: median {statistics.median(ratios):.3f}, "
              f"range {min(ratios):.3f}-{max(ratios):.3f}")
    if args.out:
        Path(args.out).write_text(json.dumps({"device": kind, "cores": cores,
                                              "candidates": len(records), "baseline": baseline, "evaluate": ours,
                                              "mismatches": mismatches}, indent=1))


if __name__ == "__main__":
    main()
