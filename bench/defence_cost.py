"""What evaluate.py's runtime defences cost: wall time per candidate with and without them, in one run.

The candidates (by default the first 20 hand-written CUDA candidates in solutions/cuda that must come out
correct, incorrect or runtime_error) are built once first, so that both passes below measure checking and timing only.
Then each is evaluated with every defence on, and again with `EvalConfig(defences=False)` (no NaN
poison, no clones, no second run, no host probes, no profiler, no fresh timing inputs, no spot checks, no
tamper checks), on one GPU. It prints a row per candidate — seconds of its checking-and-timing child with and without, status and speedup
of each — and the totals.

    python bench/defence_cost.py --out results/defence_cost_h200.json
"""
import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

# --tree DIR: evaluate with another checkout's evaluator (an older one, say) on this checkout's candidates.
CANDIDATES = Path(__file__).resolve().parents[1]
TREE = Path(sys.argv[sys.argv.index("--tree") + 1]).resolve() if "--tree" in sys.argv else CANDIDATES
sys.path.insert(0, str(TREE))
import evaluate as ev  # noqa: E402


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="auto", help="cuda, cpu or auto")
    p.add_argument("--count", type=int, default=20, help="number of candidates")
    p.add_argument("--gpu", type=int, default=0, help="the one GPU both passes run on")
    p.add_argument("--out", help="write every number to this JSON file")
    p.add_argument("--tree", default=str(TREE), help="the checkout whose evaluate.py judges (default: this one); the "
                   "candidates are always this checkout's, so two trees can be compared on the same ones")
    args = p.parse_args()

    kind, _ = ev.resolve_device(ev.EvalConfig(device=args.device))
    tasks = str(CANDIDATES / ("tasks" if kind == "cuda" else "tests/tasks"))
    library = [r for r in ev.library_records(CANDIDATES / "solutions" / kind)
               if any(f".{status}_" in r["solution"] for status in ("correct", "incorrect", "runtime_error"))]
    records = library[:args.count]
    config = dict(device=kind, tasks=tasks, gpus=[args.gpu] if kind == "cuda" else None)
    print(f"{len(records)} candidates; building them first (a quick pass: the builds are cached for both)",
          file=sys.stderr)
    ev.evaluate(records, ev.EvalConfig(**config, defences=False, correct_trials=1, timing_trials=10, warmup=0))

    passes = {}
    for name, defences in (("with", True), ("without", False)):
        start = time.perf_counter()
        results = ev.evaluate(records, ev.EvalConfig(**config, defences=defences))
        passes[name] = {"wall_s": time.perf_counter() - start, "results": results}

    def cell(result: dict) -> str:
        speedup = f" {result['speedup']:.2f}x" if result.get("speedup") else ""
        return f"{result['time_s']['run']:.1f} s, {result['status']}{speedup}"

    print("| candidate | with defences | without |\n|---|---|---|")
    for record, on, off in zip(records, passes["with"]["results"], passes["without"]["results"]):
        print(f"| {record['solution']} | {cell(on)} | {cell(off)} |")
    per_candidate = {name: [r["time_s"]["run"] for r in run["results"]] for name, run in passes.items()}
    on, off = (sum(per_candidate[n]) for n in ("with", "without"))
    print(f"\nseconds per candidate: median {statistics.median(per_candidate['with']):.1f} with, "
          f"{statistics.median(per_candidate['without']):.1f} without; total {on:.0f} s vs {off:.0f} s "
          f"({on / off:.2f}x); pass wall {passes['with']['wall_s']:.0f} s vs {passes['without']['wall_s']:.0f} s")
    same = sum(a["status"] == b["status"] for a, b in zip(passes["with"]["results"], passes["without"]["results"]))
    print(f"same statuses: {same}/{len(records)}")
    if args.out:
        Path(args.out).write_text(json.dumps({"device": kind, "tree": os.path.relpath(TREE, CANDIDATES),
                                              "candidates": [r["solution"] for r in records],
                                              **{name: {"wall_s": run["wall_s"], "results": run["results"]}
                                                 for name, run in passes.items()}}, indent=1))


if __name__ == "__main__":
    main()
