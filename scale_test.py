"""Test-time scaling: serial refinement against parallel sampling at a fixed budget of kernels.

A budget of B kernels per task can be spent as n trajectories x T turns with n * T = B. The paper's
allocations for B = 128 are 16 x 8, 32 x 4 and 128 x 1 (--turns 8,4,1); other budgets keep the same
turn counts. Metrics, as the paper defines them:
  a trajectory cut to T turns is correct if any of its kernels is; its speedup is its best correct
  kernel's (0 if none).
  best@k  expected max over a random k-subset of a task's trajectories (unbiased estimator, Chen et al.)
  avg@k   expected mean over a random k-subset = the mean over all trajectories
  fast_p  share of tasks whose best@k speedup is >= p, estimated per task as the chance that a random
          k-subset holds a correct kernel at least p times faster than eager (p = 1.0, 1.5)
Each number is a mean over tasks.

Offline (default): read one or more trajectory files from generate.py. An allocation n x T uses each
trajectory's first T turns and estimates with k = n from the task's pool, so a pool of 16 x 8 gives
16 x 8 at budget 128 and 2 x 8, 4 x 4, 16 x 1 at budget 16. Allocations that need more trajectories
than a pool holds are reported as skipped. Curves: every metric against turns (k fixed) and against
k (turns fixed).

Live (--live): run generate.py for each allocation with exactly n trajectories x T turns (written to
--out-dir), then measure them as above (k = n); the curves come from the allocation with the most turns.

Beam search, a third strategy: --beam-width trajectories for budget / width turns; after every turn
keep the --beam-keep trajectories with the fastest correct kernel so far and copy each width / keep
times (paper: 16 wide, keep 4). It needs fresh generation after each pruning, so offline mode cannot
do it. Live, each task's beam runs on its own (its `width` trajectories share one generation batch),
with generate.py's `run_turns` (one turn) as the step; a copy gets its own sampling seed from its new position.

Run:
  python scale_test.py runs/eval.jsonl --budget 16 --out runs/scale.json --plot-dir runs/scale
  python scale_test.py --live --budget 128 --out runs/scale.json \\
      --generate-args "--backend vllm --model Qwen/QwQ-32B --tasks tasks/level1"

Plots need matplotlib (optional: pip install matplotlib).
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import shlex
import subprocess
import sys
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

from kevin.config_flags import AT_LEAST_1, add_config_flags, check, config_from, parse_config
from kevin.startup import freeze_at_exit

ROOT = Path(__file__).resolve().parent
from kevin.rewards import load_trajectories


@dataclass(frozen=True)
class ScaleTestConfig:
    """What a run measures and where it writes: each field is a flag (kevin/config_flags.py), so its default and
    its help are written here only."""
    budget: int = 128
    """kernels per task every allocation spends"""
    turns: list[int] = field(default_factory=lambda: [8, 4, 1])
    """turns per trajectory of each allocation; trajectories = budget / turns"""
    thresholds: list[float] = field(default_factory=lambda: [1.0, 1.5])
    """speedups p reported as fast_p"""
    curve_k: int | None = None
    """k of the metrics-against-turns curve (default: the smallest pool)"""
    curve_turns: int | None = None
    """turns of the metrics-against-k curve (default: the longest trajectory)"""
    live: bool = False
    """generate fresh rollouts with generate.py instead of reading files"""
    generate_args: str = ""
    '''live: flags for generate.py in one string, e.g. "--backend vllm --model M --tasks tasks/level1"'''
    out_dir: Path = Path("runs/scale_test")
    """live: where each allocation's rollouts go (NxT.jsonl); an existing file is resumed"""
    beam_width: int = 16
    """live beam search: trajectories kept alive (turns = budget / width)"""
    beam_keep: int = 4
    """live beam search: best trajectories kept after each turn"""
    out: Path | None = None
    """write every number here as JSON"""
    plot_dir: Path | None = None
    """write PNG curves here (needs matplotlib)"""

    def __post_init__(self):
        """What needs no trajectories: a budget below 1 spends nothing, an allocation of n x T spends n * T = budget
        with T >= 1, and a threshold of 0 would count incorrect trajectories (speedup 0) as fast; what depends on the
        pools or on --live is checked where those are known."""
        check(self, {"budget": AT_LEAST_1, "turns": ("each be at least 1", lambda turns: min(turns) >= 1),
                     "thresholds": ("each be positive", lambda thresholds: min(thresholds) > 0)})
        for t in self.turns:
            if self.budget % t:
                raise ValueError(f"--budget {self.budget} is not divisible by a turn count of {t}")


# ---------------------------------------------------------------- metrics
def trajectory_outcome(evals: Sequence[dict], turns: int) -> tuple[bool, float]:
    """(correct, speedup) of a trajectory cut to its first `turns` turns."""
    speedups = [ev["speedup"] for ev in evals[:turns] if ev["correct"]]
    return bool(speedups), max(speedups, default=0.0)


def best_at_k(values: Sequence[float], k: int) -> float:
    """Expected max over a uniformly random k-subset of n values, exactly and without enumerating subsets.

    The i-th smallest value (1-based) is the max of C(i-1, k-1) of the C(n, k) subsets.
    """
    n = len(values)
    if not 1 <= k <= n:
        raise ValueError(f"k must be in [1, {n}], got {k}")
    total = math.comb(n, k)
    return sum(v * (math.comb(i, k - 1) / total) for i, v in enumerate(sorted(values)))


def pass_at_k(n: int, c: int, k: int) -> float:
    """Chance that a random k-subset of n items holds at least one of c good ones: 1 - C(n-c, k)/C(n, k)."""
    if not 1 <= k <= n or not 0 <= c <= n:
        raise ValueError(f"need 1 <= k <= n and 0 <= c <= n, got n={n}, c={c}, k={k}")
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def fast_key(p: float) -> str:
    return f"fast_{float(p)}"  # fast_1.0, fast_1.5


def task_metrics(outcomes: Sequence[tuple[bool, float]], k: int, thresholds: Sequence[float]) -> dict[str, float]:
    """Every metric for one task's pool of (correct, speedup) trajectory outcomes."""
    n = len(outcomes)
    speedups = [s for _, s in outcomes]
    correct = sum(c for c, _ in outcomes)
    metrics = {"correct_best": pass_at_k(n, correct, k), "correct_avg": correct / n,
               "speedup_best": best_at_k(speedups, k), "speedup_avg": sum(speedups) / n}
    for p in thresholds:  # p > 0, and an incorrect trajectory has speedup 0, so only correct ones count
        metrics[fast_key(p)] = pass_at_k(n, sum(s >= p for s in speedups), k)
    return metrics


def mean_metrics(per_task: dict[str, dict[str, float]]) -> dict[str, float]:
    names = next(iter(per_task.values())).keys()
    return {name: sum(m[name] for m in per_task.values()) / len(per_task) for name in names}


def pool_metrics(pools: dict[str, list[list[dict]]], turns: int, k: int,
                 thresholds: Sequence[float]) -> tuple[dict[str, float], dict[str, dict[str, float]]]:
    """Mean over tasks and per-task metrics, trajectories cut to `turns` turns, subsets of size k."""
    per_task = {task: task_metrics([trajectory_outcome(evals, turns) for evals in pool], k, thresholds)
                for task, pool in sorted(pools.items())}
    return mean_metrics(per_task), per_task


def allocations(budget: int, turn_counts: Sequence[int]) -> list[tuple[int, int]]:
    """(trajectories, turns) pairs that spend exactly `budget` kernels (ScaleTestConfig: each count divides it)."""
    return [(budget // t, t) for t in turn_counts]


# ---------------------------------------------------------------- beam search
def best_correct_speedup(trajectory: dict) -> float:
    """Beam ranking: the fastest correct kernel so far (0 if none)."""
    return trajectory_outcome([turn["eval"] for turn in trajectory["turns"]], len(trajectory["turns"]))[1]


def beam_search(states: list, step: Callable[[list], list], turns: int, keep: int,
                score: Callable = best_correct_speedup) -> list:
    """Run `turns` turns over len(states) beams; after every turn but the last keep the top `keep`
    by `score` (ties keep the earlier beam) and copy each len(states) / keep times."""
    width = len(states)
    if not 1 <= keep <= width or width % keep:
        raise ValueError(f"beam keep {keep} must divide the beam width {width}")
    for turn in range(turns):
        states = step(states)
        if turn < turns - 1:
            survivors = sorted(states, key=score, reverse=True)[:keep]
            states = [copy.deepcopy(s) for s in survivors for _ in range(width // keep)]
    return states


# ---------------------------------------------------------------- report
def group_pools(trajectories: list[dict]) -> dict[str, list[list[dict]]]:
    """task -> one list of eval dicts per trajectory."""
    pools = defaultdict(list)
    for trajectory in trajectories:
        pools[trajectory["task"]].append([turn["eval"] for turn in trajectory["turns"]])
    return dict(pools)


def pool_shape(pools: dict[str, list[list[dict]]]) -> dict[str, int]:
    return {"trajectories_min": min(len(p) for p in pools.values()),
            "trajectories_max": max(len(p) for p in pools.values()),
            "turns_max": max(len(evals) for pool in pools.values() for evals in pool)}


def allocation_row(pools: dict[str, list[list[dict]]], n: int, turns: int, thresholds: Sequence[float]) -> dict:
    """Metrics of n trajectories x `turns` turns (k = n), or why the pools cannot estimate them."""
    row = {"strategy": "independent", "trajectories": n, "turns": turns, "kernels": n * turns, "k": n}
    shape = pool_shape(pools)
    if n > shape["trajectories_min"]:
        row["skipped"] = f"needs {n} trajectories per task, the smallest pool has {shape['trajectories_min']}"
    elif turns > shape["turns_max"]:
        row["skipped"] = f"needs {turns} turns, the longest trajectory has {shape['turns_max']}"
    else:
        row["metrics"], row["per_task"] = pool_metrics(pools, turns, n, thresholds)
    return row


def curves(pools: dict[str, list[list[dict]]], thresholds: Sequence[float],
           curve_k: int | None, curve_turns: int | None) -> dict:
    """Every metric against turns (k fixed, default the smallest pool) and against k (turns fixed,
    default the longest trajectory)."""
    shape = pool_shape(pools)
    curve_k = curve_k or shape["trajectories_min"]
    curve_turns = curve_turns or shape["turns_max"]
    if not 1 <= curve_k <= shape["trajectories_min"]:
        raise SystemExit(f"error: --curve-k must be in [1, {shape['trajectories_min']}] (the smallest pool), "
                         f"got {curve_k}")
    if not 1 <= curve_turns <= shape["turns_max"]:
        raise SystemExit(f"error: --curve-turns must be in [1, {shape['turns_max']}] (the longest trajectory), "
                         f"got {curve_turns}")
    return {
        "vs_turns": {"k": curve_k, "points": [{"turns": t, **pool_metrics(pools, t, curve_k, thresholds)[0]}
                                              for t in range(1, shape["turns_max"] + 1)]},
        "vs_k": {"turns": curve_turns, "points": [{"k": k, **pool_metrics(pools, curve_turns, k, thresholds)[0]}
                                                  for k in range(1, shape["trajectories_min"] + 1)]},
    }


def offline_report(pools: dict[str, list[list[dict]]], budget: int, turn_counts: Sequence[int],
                   thresholds: Sequence[float], curve_k: int | None, curve_turns: int | None) -> dict:
    """Every number for the allocations and both curves, estimated from fixed pools; pools that no allocation
    fits are a one-line error, not a table of skipped rows."""
    rows = [allocation_row(pools, n, t, thresholds) for n, t in allocations(budget, turn_counts)]
    if all("skipped" in row for row in rows):
        shape = pool_shape(pools)
        raise SystemExit(f"error: --budget {budget} with --turns {','.join(map(str, turn_counts))}: no allocation "
                         f"fits the files, whose smallest pool has {shape['trajectories_min']} trajectories of up to "
                         f"{shape['turns_max']} turns; lower --budget")
    return {"mode": "offline", "budget": budget, "tasks": len(pools), "pool": pool_shape(pools),
            "allocations": rows, "curves": curves(pools, thresholds, curve_k, curve_turns)}


def live_beam(generate_args: list[str], width: int, turns: int, keep: int, path: Path) -> list[dict]:
    """Beam search with generate.py's own turn, one task at a time; finished tasks are appended to
    `path`, and a re-run skips them."""
    from kevin.evaluator import EvalConfig  # torch and transformers load only in live mode
    from kevin.rollout_config import GenerateConfig
    from kevin.rollouts import kernel_device, make_backend, run_turns
    from kevin.tasks import load_tasks

    p = argparse.ArgumentParser(prog="scale_test.py --generate-args")
    add_config_flags(p, GenerateConfig)
    args = parse_config(p, GenerateConfig, [*generate_args, "--n-trajectories", str(width), "--turns", str(turns),
                                            "--out", str(path)])
    done = load_trajectories(str(path)) if path.exists() else []
    todo = [task for task in load_tasks(args.tasks, args.split) if task.id not in {t["task"] for t in done}]
    if not todo:
        return done
    device = kernel_device(args)
    backend = make_backend(args)
    eval_config = EvalConfig(device=device, gpus=args.gpus, rules=args.rules, ray=args.ray)
    for task in todo:
        def step(states: list[dict]) -> list[dict]:
            for position, state in enumerate(states):
                state["trajectory"] = position  # copies of one beam draw their own samples
            run_turns(states, [task] * len(states), backend, eval_config, turns=1, seed=args.seed,
                               device=device, context_budget=args.context_budget)
            return states

        final = beam_search([{"task": task.id, "trajectory": k, "turns": []} for k in range(width)], step, turns, keep)
        with path.open("a") as f:
            f.writelines(json.dumps(state) + "\n" for state in final)
        done += final
    return done


def live_report(cfg: ScaleTestConfig) -> dict:
    """Generate exactly n x T rollouts per allocation with generate.py, then measure them as offline."""
    generate_args = shlex.split(cfg.generate_args)
    for flag in ("--n-trajectories", "--turns", "--out"):
        if any(a == flag or a.startswith(flag + "=") for a in generate_args):
            raise SystemExit(f"error: --generate-args must not set {flag}: scale_test.py sets it per allocation")
    if cfg.budget % cfg.beam_width or cfg.beam_width % cfg.beam_keep:
        raise SystemExit("error: --beam-width must divide --budget and --beam-keep must divide --beam-width")
    cfg.out_dir.mkdir(exist_ok=True)  # its folder exists: main checked
    rows, files, pools_by_turns = [], [], {}
    for n, t in allocations(cfg.budget, cfg.turns):
        path = cfg.out_dir / f"{n}x{t}.jsonl"
        print(f"allocation {n} x {t}: generating into {path}", file=sys.stderr)
        generate = [sys.executable, str(ROOT / "generate.py"), *generate_args, "--n-trajectories", str(n),
                    "--turns", str(t), "--out", str(path)]
        if code := subprocess.run(generate).returncode:
            raise SystemExit(code)
        # a resumed file may hold more trajectories
        pools = group_pools([r for r in load_trajectories(str(path)) if r["trajectory"] < n])
        rows.append(allocation_row(pools, n, t, cfg.thresholds))
        files.append(str(path))
        pools_by_turns[t] = pools
    beam_turns = cfg.budget // cfg.beam_width
    path = cfg.out_dir / f"beam_{cfg.beam_width}x{beam_turns}_keep{cfg.beam_keep}.jsonl"
    print(f"beam {cfg.beam_width} x {beam_turns}, keeping {cfg.beam_keep}: generating into {path}", file=sys.stderr)
    beams = live_beam(generate_args, cfg.beam_width, beam_turns, cfg.beam_keep, path)
    rows.append({**allocation_row(group_pools(beams), cfg.beam_width, beam_turns, cfg.thresholds),
                 "strategy": "beam"})
    files.append(str(path))
    serial = pools_by_turns[max(pools_by_turns)]  # the curves come from the allocation with the most turns
    return {"mode": "live", "budget": cfg.budget, "generate_args": generate_args, "files": files,
            "tasks": len(serial), "allocations": rows,
            "curves": curves(serial, cfg.thresholds, cfg.curve_k, cfg.curve_turns)}


def markdown_table(rows: list[dict], thresholds: Sequence[float]) -> str:
    fast = [fast_key(p) for p in thresholds]
    header = ["strategy", "trajectories x turns", "kernels", "correct best@k", "correct avg@k",
              "speedup best@k", "speedup avg@k", *fast]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in rows:
        cells = [row["strategy"], f"{row['trajectories']} x {row['turns']}", str(row["kernels"])]
        if "skipped" in row:
            cells += [f"skipped: {row['skipped']}"] + [""] * (len(header) - 4)
        else:
            m = row["metrics"]
            cells += [f"{m['correct_best']:.1%}", f"{m['correct_avg']:.1%}", f"{m['speedup_best']:.2f}x",
                      f"{m['speedup_avg']:.2f}x", *(f"{m[f]:.1%}" for f in fast)]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def import_pyplot():
    try:
        import matplotlib
    except ImportError:
        raise SystemExit("error: --plot-dir needs matplotlib, which is not installed: pip install matplotlib") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def plot_curves(curves: dict, thresholds: Sequence[float], plot_dir: Path) -> list[Path]:
    """One PNG per curve: correctness, speedup and fast_p panels against turns or k."""
    plt = import_pyplot()
    plot_dir.mkdir(exist_ok=True)
    paths = []
    for name, x_key, fixed in (("vs_turns", "turns", "k"), ("vs_k", "k", "turns")):
        curve = curves[name]
        x = [point[x_key] for point in curve["points"]]
        fig, axes = plt.subplots(1, 3, figsize=(13, 3.8))
        panels = (("correctness", ("correct_best", "correct_avg"), True),
                  ("speedup over eager", ("speedup_best", "speedup_avg"), False),
                  ("fast_p (best@k)", tuple(fast_key(p) for p in thresholds), True))
        for ax, (title, keys, is_share) in zip(axes, panels):
            for key in keys:
                ax.plot(x, [point[key] for point in curve["points"]], marker="o", label=key.replace("_", " "))
            ax.set_title(title)
            if is_share:
                ax.set_ylim(-0.03, 1.03)
            ax.set_xlabel("turns" if x_key == "turns" else "k (parallel trajectories)")
            ax.legend()
            ax.grid(alpha=0.3)
        fig.suptitle(f"metrics against {x_key} ({fixed} = {curve[fixed]})")
        fig.tight_layout()
        path = plot_dir / f"{name}.png"
        fig.savefig(path, dpi=100)
        plt.close(fig)
        paths.append(path)
    return paths


# ---------------------------------------------------------------- main
def _parser() -> argparse.ArgumentParser:
    """The trajectory files, then one flag per ScaleTestConfig field (kevin/config_flags.py)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("files", nargs="*", help="trajectory JSONL files from generate.py (offline mode)")
    add_config_flags(p, ScaleTestConfig)
    return p


def main(argv: list[str] | None = None) -> None:
    args = _parser().parse_args(argv)
    cfg = config_from(args, ScaleTestConfig)
    if cfg.out and cfg.out.is_dir():
        raise SystemExit(f"error: --out {cfg.out} is a folder; give a file, e.g. "
                         f"{cfg.out / 'scale.json'}")
    if cfg.plot_dir and cfg.plot_dir.is_file():
        raise SystemExit(f"error: --plot-dir {cfg.plot_dir} is a file, not a folder")
    for output in (cfg.out, cfg.plot_dir, cfg.out_dir if cfg.live else None):
        if output and not output.parent.is_dir():  # as evaluate.py -o and generate.py --out: made by no stage
            raise SystemExit(f"error: cannot write {output}: No such file or directory")
    if cfg.plot_dir:
        import_pyplot()  # fail before any work
    if cfg.live:
        if args.files:
            raise SystemExit("error: --live generates its own rollouts: give no trajectory files")
        report = live_report(cfg)
    else:
        if not args.files:
            raise SystemExit("error: give one or more trajectory files, or --live")
        trajectories = [t for path in args.files for t in load_trajectories(path)]
        if not trajectories:
            raise SystemExit("error: the trajectory files hold no trajectories")
        report = offline_report(group_pools(trajectories), cfg.budget, cfg.turns, cfg.thresholds,
                                cfg.curve_k, cfg.curve_turns)
        report["files"] = args.files
    report["thresholds"] = cfg.thresholds

    print(markdown_table(report["allocations"], cfg.thresholds))
    if cfg.out:
        cfg.out.write_text(json.dumps(report, indent=1))
        print(f"wrote {cfg.out}", file=sys.stderr)
    if cfg.plot_dir:
        for path in plot_curves(report["curves"], cfg.thresholds, cfg.plot_dir):
            print(f"wrote {path}", file=sys.stderr)


if __name__ == "__main__":
    freeze_at_exit()
    main()
