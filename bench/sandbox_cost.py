"""What boxing candidates in costs: evaluate.py on the throughput benchmark's candidates, sandbox off and on.

The candidate set of bench/eval_throughput.py (every task's first correct kernel, a renamed attempt, a copy
that does not compile, a duplicate) is evaluated with `--sandbox off` and then `--sandbox auto`, each into an
empty build folder, in one process on the same machine. It prints kernels per minute of each, their ratio,
CPU-seconds per kernel, and whether the statuses agree. With --compare it reads two files saved by
`eval_throughput.py --part evaluate --save` (say, before and after a change, run one after the other on one
machine) and prints the same comparison of them.

    python bench/sandbox_cost.py                                  # off, then auto, on the GPU if any
    python bench/sandbox_cost.py --device cpu
    python bench/sandbox_cost.py --compare before.json after.json --device cuda --out results/sandbox_cost_h200.json
"""
import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

import eval_throughput  # noqa: E402
from kevin import evaluator as ev


def evaluate_with(records: list[dict], kind: str, tasks_dir: str, sandbox: str) -> dict:
    with tempfile.TemporaryDirectory() as build_dir:
        cfg = ev.EvalConfig(device=kind, tasks=tasks_dir, build_dir=build_dir, sandbox=sandbox,
                            compile_workers=len(os.sched_getaffinity(0)))
        return eval_throughput.run_evaluator(records, cfg)


def report(runs: dict[str, dict], records: list[dict]) -> str:
    """The runs side by side: kernels/min, wall, CPU-seconds per kernel; the ratio of the last to the first;
    the candidates whose status differs."""
    lines = ["| run | kernels/min | wall s | compile CPU-s/kernel | check CPU-s/kernel |", "|---|---|---|---|---|"]
    for name, run in runs.items():
        cpu = run["cpu_s_per_kernel"]
        lines.append(f"| {name} | {len(records) / run['wall_s'] * 60:.1f} | {run['wall_s']:.0f} | "
                     f"{cpu['compile']:.1f} | {cpu['check and time']:.1f} |")
    (first, a), (last, b) = list(runs.items())[0], list(runs.items())[-1]
    lines.append(f"\nthroughput {last} / {first}: {a['wall_s'] / b['wall_s']:.3f}x")
    differ = [(r.get("solution"), r.get("variant"), x["status"], y["status"])
              for r, x, y in zip(records, a["results"], b["results"]) if x["status"] != y["status"]]
    lines.append(f"same statuses: {len(records) - len(differ)}/{len(records)}" +
                 "".join(f"\n  {s} [{v}]: {first} {x}, {last} {y}" for s, v, x, y in differ))
    return "\n".join(lines)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="auto", help="cuda, cpu or auto")
    p.add_argument("--tasks", default=None, help="task folder (default: tasks/, or tests/tasks/ on a CPU)")
    p.add_argument("--compare", nargs=2, metavar=("FIRST_JSON", "SECOND_JSON"),
                   help="compare two saved `eval_throughput.py --part evaluate` runs instead of running")
    p.add_argument("--out", help="write every number to this JSON file")
    args = p.parse_args()
    # comparing saved runs needs no device, only which candidate set they ran (--device cuda or cpu)
    kind = args.device if args.compare and args.device != "auto" else \
        ev.resolve_device(ev.EvalConfig(device=args.device))[0]
    tasks_dir = args.tasks or str(ev.ROOT / ("tasks" if kind == "cuda" else "tests/tasks"))
    records = eval_throughput.candidate_set(kind)
    if args.compare:
        runs = {Path(f).stem: json.loads(Path(f).read_text()) for f in args.compare}
    else:
        runs = {f"sandbox {mode}": evaluate_with(records, kind, tasks_dir, mode) for mode in ("off", "auto")}
    print(f"{len(records)} candidates, {kind}, {len(os.sched_getaffinity(0))} cores", file=sys.stderr)
    print(report(runs, records))
    if args.out:
        Path(args.out).write_text(json.dumps({"device": kind, "candidates": len(records), "runs": runs}, indent=1))


if __name__ == "__main__":
    main()
