"""Is a speedup a property of the kernel or of the moment? Evaluate the correct hand-written kernels in
solutions/<device>/ in two separate runs (fresh worker processes each time) and compare the speedups.

    python bench/repeatability.py            # on the GPU machine
    python bench/repeatability.py --runs 3 --out repeat.json
    python bench/repeatability.py --device cpu --runs 3 --load 3 --tree ../older   # a load that comes and goes
"""
import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

# --tree DIR: evaluate with another checkout's evaluator (an older one, say) on this checkout's candidates.
CANDIDATES = Path(__file__).resolve().parents[1]
TREE = Path(sys.argv[sys.argv.index("--tree") + 1]).resolve() if "--tree" in sys.argv else CANDIDATES
sys.path.insert(0, str(TREE))
import evaluate as ev  # noqa: E402


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="auto", help="cuda, cpu or auto")
    p.add_argument("--runs", type=int, default=2, help="separate evaluation runs to compare")
    p.add_argument("--max-spread", type=float, default=0.05, help="largest relative spread counted as repeatable")
    p.add_argument("--out", help="write every number to this JSON file")
    p.add_argument("--load", type=int, default=0, help="processes spinning on the cores during the runs, stopped and "
                   "started again every --load-period-s: a host whose load comes and goes, as beside a training job")
    p.add_argument("--load-period-s", type=float, default=2.0, help="seconds the load stays on, then off")
    p.add_argument("--tree", default=str(TREE), help="the checkout whose evaluate.py judges (default: this one); the "
                   "candidates are always this checkout's, so two trees can be compared on the same ones")
    args = p.parse_args()

    kind, _ = ev.resolve_device(ev.EvalConfig(device=args.device))
    records = [r for r in ev.library_records(CANDIDATES / "solutions" / kind) if ".correct_" in r["solution"]]
    tasks = str(CANDIDATES / ("tasks" if kind == "cuda" else "tests/tasks"))
    with changing_load(args.load, args.load_period_s):
        runs = [ev.evaluate(records, ev.EvalConfig(device=kind, tasks=tasks)) for _ in range(args.runs)]

    print("| kernel | " + " | ".join(f"speedup run {i + 1}" for i in range(args.runs)) + " | spread |")
    print("|---|" + "---|" * (args.runs + 1))
    rows, worst = [], 0.0
    for i, record in enumerate(records):
        speedups = [run[i]["speedup"] for run in runs]
        if None in speedups:
            print(f"| {record['solution']} | " + " | ".join(run[i]["status"] for run in runs) + " | - |")
            worst = float("inf")
            continue
        spread = (max(speedups) - min(speedups)) / min(speedups)
        worst = max(worst, spread)
        rows.append({"solution": record["solution"], "speedups": speedups, "spread": spread,
                     "runtime_ms": [run[i]["runtime_ms"] for run in runs],
                     "ref_runtime_ms": [run[i]["ref_runtime_ms"] for run in runs]})
        print(f"| {record['solution']} | " + " | ".join(f"{s:.3f}x" for s in speedups) + f" | {spread:.1%} |")
    print(f"\nlargest spread: {worst:.1%} ({'within' if worst < args.max_spread else 'OVER'} "
          f"{args.max_spread:.0%}) over {len(records)} kernels")
    if args.out:
        Path(args.out).write_text(json.dumps({"device": kind, "tree": os.path.relpath(TREE, CANDIDATES), "kernels": rows,
                                              "largest_spread": worst, "load": args.load,
                                              "load_period_s": args.load_period_s}, indent=1))


@contextlib.contextmanager
def changing_load(spinning: int, period_s: float):
    """`spinning` busy processes, all paused and resumed together every `period_s` while the block runs."""
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(spinning)]
    done = threading.Event()

    def toggle():
        paused = False
        while not done.wait(period_s):
            paused = not paused
            for hog in hogs:
                hog.send_signal(signal.SIGSTOP if paused else signal.SIGCONT)

    toggler = threading.Thread(target=toggle, daemon=True)
    toggler.start()
    try:
        yield
    finally:
        done.set()
        toggler.join()
        for hog in hogs:
            hog.kill()
            hog.wait()


if __name__ == "__main__":
    main()
