"""Rollouts with and without a barrier between turns: train.py's step split into generating, building and
checking kernels, the update and the weight push, synchronous against --overlap.

Both runs are train.py on the same policy, tasks, seed and sizes, the second with --overlap. Each step's log
has time/rollout_s and, within it, time/generate_s (the generate calls), time/build_s and time/check_s (the
wall seconds during which at least one kernel was being built, and during which one was being checked and
timed: kernels that overlap count once), then time/update_s and time/push_s (the vLLM weight push; 0 with the
hf backend). The table gives each phase's median over the steps after the first (which warms up, and builds the
kernels the cache does not hold yet: the same seeds give both runs the same first turns, and the synchronous run
goes first), for both runs and their ratio, and how far the rollout's phases overlapped (their sum over its wall
time: 1.0x when they ran one after the other).

A random model writes no kernel (all format errors: nothing to build, check or overlap), so by default the policy
is warm-started first (warm_start.py, whose library it then writes almost word for word, as in
bench/learning_demo.py); --model takes a model already trained, or `tiny` for the random one.

    python bench/rollout_overlap.py --out-dir runs/rollout_overlap                       # GPU machine
    python bench/rollout_overlap.py --device cpu --warm-args "--turns 1 --layers 1 --epochs 100 --batch-size 1 \
        --check-samples 0" --steps 3 --n-trajectories 2 --turns 2 --out-dir runs/rollout_overlap_cpu
"""
import argparse
import json
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

from learning_demo import repo_relative

REPO = Path(__file__).resolve().parents[1]
PHASES = [("generate", "generate"), ("build", "build (busy)"), ("check", "check + time (busy)"),
          ("rollout", "rollout (wall)"), ("update", "update"), ("push", "weight push"), ("step", "step (wall)")]


def train_command(args, model: str, overlap: bool, out: Path) -> list[str]:
    return [sys.executable, str(REPO / "train.py"), "--model", model, "--tasks", args.tasks,
            "--tasks-per-step", str(args.tasks_per_step), "--n-trajectories", str(args.n_trajectories),
            "--turns", str(args.turns), "--steps", str(args.steps), "--max-tokens", str(args.max_tokens),
            "--device", args.device, "--seed", str(args.seed), "--no-bf16", "--save-every", str(args.steps),
            "--out", str(out), "--overwrite", *(["--overlap"] if overlap else []), *shlex.split(args.train_args)]


def step_seconds(metrics: list[dict]) -> list[dict[str, float]]:
    """Each step's phases, and the step's wall time: the rollout, the update and the push."""
    rows = [{name: m.get(f"time/{name}_s", 0.0) for name, _ in PHASES[:-1]} for m in metrics]
    return [{**row, "step": row["rollout"] + row["update"] + row["push"]} for row in rows]


def medians(rows: list[dict[str, float]]) -> dict[str, float]:
    """Each phase's median over the steps after the first (all of them if there is one)."""
    kept = rows[1:] or rows
    return {name: statistics.median(row[name] for row in kept) for name, _ in PHASES}


def overlap_factor(seconds: dict[str, float]) -> float:
    """The rollout's phases over its wall time: 1.0 when they ran one after the other."""
    return (seconds["generate"] + seconds["build"] + seconds["check"]) / max(seconds["rollout"], 1e-9)


def table(sync: dict[str, float], overlapped: dict[str, float]) -> str:
    lines = ["| phase | synchronous s | overlapped s | synchronous / overlapped |", "|---|---|---|---|"]
    for name, label in PHASES:
        ratio = f"{sync[name] / overlapped[name]:.2f}x" if min(sync[name], overlapped[name]) >= 0.01 else "-"
        lines.append(f"| {label} | {sync[name]:.2f} | {overlapped[name]:.2f} | {ratio} |")
    lines.append(f"| rollout phases / rollout wall | {overlap_factor(sync):.2f}x | {overlap_factor(overlapped):.2f}x "
                 "| |")
    return "\n".join(lines)


def parse_args(argv=None) -> argparse.Namespace:
    import torch

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", choices=["cuda", "cpu"], default=None,
                   help="cuda: CUDA kernels on the GPU; cpu: C++ kernels on tests/tasks (default: cuda with a GPU)")
    p.add_argument("--out-dir", default=str(REPO / "runs" / "rollout_overlap"), help="where everything is written")
    p.add_argument("--tasks", default=None, help="task folder (default: solutions/warm_start/tasks for cuda, "
                   "tests/tasks for cpu)")
    p.add_argument("--model", default=None, help="the policy (default: warm-started into OUT_DIR/warm_start first; "
                   "tiny: the random tiny model)")
    p.add_argument("--warm-args", default="", help="more warm_start.py flags, e.g. \"--epochs 20\"")
    p.add_argument("--steps", type=int, default=4, help="GRPO steps a run (the first is left out of the table)")
    p.add_argument("--n-trajectories", type=int, default=4, help="trajectories per task")
    p.add_argument("--turns", type=int, default=4, help="turns per trajectory")
    p.add_argument("--tasks-per-step", type=int, default=None, help="tasks per step (default: all of --tasks)")
    p.add_argument("--max-tokens", type=int, default=None,
                   help="most reply tokens (default: the warm start's longest library reply + 32; 128 for tiny)")
    p.add_argument("--seed", type=int, default=0, help="train.py's seed, the same for both runs")
    p.add_argument("--train-args", default="", help="more train.py flags for both runs, e.g. \"--backend vllm\"")
    args = p.parse_args(argv)
    args.device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    args.tasks = args.tasks or str(REPO / ("solutions/warm_start/tasks" if args.device == "cuda" else "tests/tasks"))
    if args.tasks_per_step is None:
        from kevin.tasks import index_tasks

        args.tasks_per_step = len(index_tasks(args.tasks))
    for flag in ("steps", "n_trajectories", "turns", "tasks_per_step"):
        if getattr(args, flag) < 1:
            raise SystemExit(f"error: --{flag.replace('_', '-')} must be at least 1")
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)

    model = args.model or str(out / "warm_start")
    report = Path(model) / "warm_start.json"
    if args.model is None and not report.exists():
        print(f"warm start -> {model}", file=sys.stderr)
        subprocess.run([sys.executable, str(REPO / "warm_start.py"), "--device", args.device, "--tasks", args.tasks,
                        "--out", model, *shlex.split(args.warm_args)], check=True)
    if args.max_tokens is None:
        args.max_tokens = json.loads(report.read_text())["longest_reply_tokens"] + 32 if report.exists() else 128

    runs = {}
    for name, overlap in (("synchronous", False), ("overlapped", True)):
        print(f"{name}: train.py, {args.steps} steps", file=sys.stderr)
        started = time.perf_counter()
        with (out / f"{name}.log").open("w") as log:
            done = subprocess.run(train_command(args, model, overlap, out / name), stdout=log, stderr=subprocess.STDOUT,
                                  cwd=REPO)
        if done.returncode:
            raise SystemExit(f"train.py failed ({name}): see {out / f'{name}.log'}")
        metrics = [json.loads(line) for line in (out / name / "metrics.jsonl").read_text().splitlines()]
        runs[name] = {"steps": step_seconds(metrics), "wall_s": round(time.perf_counter() - started, 1),
                      "score_per_step": [round(m["reward/score"], 3) for m in metrics],
                      "correct_per_step": [round(m["reward/correct"], 3) for m in metrics]}

    sync, overlapped = (medians(runs[name]["steps"]) for name in ("synchronous", "overlapped"))
    steps = f"steps 2-{args.steps}" if args.steps > 1 else "the one step"
    print(f"{args.tasks_per_step} tasks x {args.n_trajectories} trajectories x {args.turns} turns on the "
          f"{args.device}, medians of {steps}, seconds:\n")
    print(table(sync, overlapped))
    print(f"\nscore per step: synchronous {runs['synchronous']['score_per_step']}, "
          f"overlapped {runs['overlapped']['score_per_step']}")
    (out / "rollout_overlap.json").write_text(json.dumps(repo_relative(
        {"config": {**vars(args), "model": model}, "runs": runs,
         "medians": {"synchronous": sync, "overlapped": overlapped}}), indent=1))
    print(f"numbers: {out / 'rollout_overlap.json'}")


if __name__ == "__main__":
    main()
