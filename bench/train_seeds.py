"""How far does `python train.py` (the README's first command) take the policy, and how much does that vary? The
default run once per seed, each into its own folder, then the mean score and share correct over its first and its last
--window steps (one step's 16 kernels swing widely), per seed and as a range: the README's learning figures come from
this file, not from one lucky run.

    python bench/train_seeds.py --out results/train_seeds_cpu.json        # 3 seeds; on two CPU cores ~7 min each

A seed whose run finished is not run again (its minutes kept from --out); one cut short goes on from its last
checkpoint (train.py --resume), or starts afresh where it had none.
Output: --out (every step's score and share correct, per seed) and a summary table.
"""
import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
from learning_demo import go_on_or_afresh  # noqa: E402


def run_seed(seed: int, folder: Path, extra: list[str]) -> float:
    """train.py's default run for `seed` into `folder` (resumed from its last checkpoint, if any); its minutes."""
    started = time.perf_counter()
    command = [sys.executable, "train.py", "--seed", str(seed), "--out", str(folder),
               *go_on_or_afresh(REPO / folder), *extra]
    print("+", " ".join(command[1:]), flush=True)
    if subprocess.run(command, cwd=REPO).returncode != 0:
        raise SystemExit(f"error: train.py failed for seed {seed} (its output: {folder})")
    return (time.perf_counter() - started) / 60


def curve(folder: Path) -> dict[str, list[float]]:
    """Every step's mean turn score and share correct, from train.py's metrics log."""
    steps = [json.loads(line) for line in (REPO / folder / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return {"score": [s["reward/score"] for s in steps], "correct": [s["reward/correct"] for s in steps]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="one default run per seed")
    p.add_argument("--runs-dir", default="runs/train_seeds", help="where each seed's run goes (seed_<k>/)")
    p.add_argument("--out", default="runs/train_seeds/train_seeds.json", help="the JSON file of every step's numbers")
    p.add_argument("--window", type=int, default=4, help="steps averaged at the start and at the end")
    p.add_argument("train_args", nargs="*", help="more flags for train.py, after `--`")
    args = p.parse_args()
    runs, out = {}, Path(args.out)
    if not out.parent.is_dir():
        raise SystemExit(f"error: --out {out}: no folder {out.parent}")
    earlier = json.loads(out.read_text())["runs"] if out.exists() else {}  # the minutes of runs made before
    try:
        for seed in args.seeds:
            folder = Path(args.runs_dir) / f"seed_{seed}"  # relative to the repository, where train.py runs
            minutes = earlier.get(str(seed), {}).get("minutes") if (REPO / folder / "final").exists() \
                else run_seed(seed, folder, args.train_args)
            runs[seed] = {**curve(folder), "minutes": minutes}
    except KeyboardInterrupt:
        raise SystemExit(f"interrupted: {len(runs)} of {len(args.seeds)} seeds done; re-run to go on") from None
    w = args.window
    for r in runs.values():
        r.update({f"{key}_{end}": sum(part) / len(part) for key in ("score", "correct")
                  for end, part in (("start", r[key][:w]), ("end", r[key][-w:]))})
    out.write_text(json.dumps({"command": "python train.py --seed S", "train_args": args.train_args, "window": w,
                               "runs": runs}, indent=1) + "\n")
    print(f"| seed | score, steps 1-{w} → last {w} | correct, steps 1-{w} → last {w} | minutes |\n|---|---|---|---|")
    for seed, r in runs.items():
        minutes = f"{r['minutes']:.1f}" if r["minutes"] else "-"
        print(f"| {seed} | {r['score_start']:.3f} → {r['score_end']:.3f} | {r['correct_start']:.0%} → "
              f"{r['correct_end']:.0%} | {minutes} |")
    low_high = lambda key, fmt: "–".join(format(f(r[key] for r in runs.values()), fmt) for f in (min, max))  # noqa: E731
    print(f"over {len(runs)} seeds: score {low_high('score_start', '.3f')} → {low_high('score_end', '.3f')}, correct "
          f"{low_high('correct_start', '.0%')} → {low_high('correct_end', '.0%')}; written to {out}")

if __name__ == "__main__":
    main()
