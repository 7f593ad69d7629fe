"""Kevin's comparison at toy scale: does multi-turn GRPO training beat single-turn training at the same number of
kernels evaluated per step, on tasks held out from training, when the trained policies may refine over more turns
than training used (serial) or sample more trajectories (parallel) at the same kernel budget?

The paper's shape (Kevin, arXiv 2507.11948, Table 2 and its test-time scaling figure), shrunk to the small policy
that `python train.py` trains:
  1. warm start   warm_policy.policy(): the small policy warm-started on the variant library (solutions/warm_start/)
                  and on feedback-conditioned fixes (--near-misses): near misses of its correct kernels, one line
                  dropped, judged by the evaluator; each judged wrong, quoted with its real feedback (the line that
                  no longer compiles, the name missing at run time, the share of wrong values), is followed by the
                  kernel it came from. So turn t+1 can act on what turn t's feedback says, which the paper's claim is
                  about; without them the policy had only seen any-better-variant follow a failure
  2. training     for every seed, train.py from it, multi-turn (--n-trajectories n x --turns T a task) and single-turn
                  (n*T x 1): the same kernels evaluated per step, on every task of the library
  3. held-out     the warm-started policy (before RL) and both trained ones write --pool trajectories x --eval-turns
                  turns on each held-out task (solutions/warm_start/heldout/<device>: shapes of the library's
                  operators that neither the warm start nor RL saw; after a kernel that fails to compile or is wrong,
                  the next should be another, and only the feedback says which failed), seeded by the seed
  4. scoring      scale_test.py's estimators on those pools: every allocation n x T of --budget kernels a task
                  (serial 1 x budget ... parallel budget x 1), correctness and speedup per turn (k = 1) and best@k
                  per k (turns = 1), fast_1.0; the mean and the spread (population std) over seeds

Output: --out-dir holds every run (train.py's folders, the pools as generate.py JSONL, kevin_table.json); the
markdown table and the PNG go to --results (named for the device; default: --out-dir, under the untracked runs/;
`--results results` writes the copies the repository keeps). A re-run skips what is finished: a train.py run
whose metrics reach --steps and whose final model exists, a pool with every trajectory; a cut-short run resumes (an
--out-dir whose runs another policy made is refused). A Ctrl-C says in one line what is kept (exit status 130).

    python bench/kevin_table.py                        # GPU machine: CUDA kernels, the defaults
    python bench/kevin_table.py --device cpu --steps 4 --turns 2 --n-trajectories 2 --pool 4 --eval-turns 4 \
        --budget 4 --results results                   # 2-core CPU: C++ kernels, small settings (results/*_cpu.*)

On two CPU cores a pool of 4 x 8 turns on the two held-out tasks took ~5 minutes, so the CPU run serves 4 turns
(twice training's 2) and 1 x 4 to 4 x 1; the GPU defaults serve 8 turns and 1 x 8 to 8 x 1.

Simplifications: a toy policy that memorised a dozen kernels can only learn which of them to write when; the
held-out tasks are other shapes of the same operators (a new operator would need kernels it never saw); speedups
on the CPU are noisy (0.1 ms kernels on shared cores). Every kernel is still compiled, checked and timed for real.
"""
from __future__ import annotations

import argparse
import json
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # scale_test.py's metrics: the stage script itself, which no install holds
import scale_test  # noqa: E402
from kevin.learning_curves import curves, plot_steps, pyplot  # noqa: E402
from kevin.startup import quiet_ctrl_c_while_starting, started  # noqa: E402
from learning_demo import read_metrics, repo_relative, train_command  # noqa: E402

KINDS = ("warm", "multi", "single")  # the policy before RL, then trained multi-turn and single-turn
LABELS = {"warm": "warm start (no RL)", "multi": "multi-turn RL", "single": "single-turn RL"}
THRESHOLD = 1.0  # fast_1.0: a correct kernel at least as fast as eager PyTorch


# ---------------------------------------------------------------- numbers: small pure functions
def spread(values: list[float]) -> tuple[float, float]:
    """(mean, population std) over seeds; NaN for none."""
    values = [v for v in values if v == v]
    if not values:
        return float("nan"), float("nan")
    return statistics.fmean(values), statistics.pstdev(values)


def cell(values: list[float], percent: bool = False, unit: str = "x") -> str:
    """'mean ± std' over seeds, as a percentage, or with `unit` (x: a speedup; "": a score)."""
    m, s = spread(values)
    return f"{m:.0%} ± {s:.0%}" if percent else f"{m:.2f}{unit} ± {s:.2f}"


def seed_report(pools: dict[str, list[list[dict]]], budget: int, turns: int, pool: int) -> dict:
    """One policy's held-out numbers for one seed: every allocation of `budget`, the curves per turn (k = 1) and per
    k (1 turn); scale_test.py's estimators on its pools."""
    counts = [t for t in range(turns, 0, -1) if budget % t == 0 and budget // t <= pool]
    rows = [scale_test.allocation_row(pools, n, t, [THRESHOLD]) for n, t in scale_test.allocations(budget, counts)]
    return {"allocations": {f"{r['trajectories']}x{r['turns']}": r["metrics"] for r in rows if "metrics" in r},
            "per_turn": [scale_test.pool_metrics(pools, t, 1, [THRESHOLD])[0] for t in range(1, turns + 1)],
            "per_k": [scale_test.pool_metrics(pools, 1, k, [THRESHOLD])[0] for k in range(1, pool + 1)]}


def aggregate(reports: dict[str, dict[int, dict]]) -> dict:
    """Per kind, every number as its list over seeds (kind -> section -> key -> metric -> [per seed])."""
    out = {}
    for kind, by_seed in reports.items():
        seeds = sorted(by_seed)
        first = by_seed[seeds[0]]
        out[kind] = {"allocations": {a: {m: [by_seed[s]["allocations"][a][m] for s in seeds] for m in first[
            "allocations"][a]} for a in first["allocations"]},
            "per_turn": [{m: [by_seed[s]["per_turn"][i][m] for s in seeds] for m in row}
                         for i, row in enumerate(first["per_turn"])],
            "per_k": [{m: [by_seed[s]["per_k"][i][m] for s in seeds] for m in row}
                      for i, row in enumerate(first["per_k"])]}
    return out


def verdict(agg: dict, allocation: str) -> dict:
    """Multi-turn against single-turn RL on the held-out tasks at one allocation: the per-seed differences of best@k
    speedup and of correctness, their mean and std, and whether the mean is above 0."""
    multi, single = agg["multi"]["allocations"][allocation], agg["single"]["allocations"][allocation]
    speed = [m - s for m, s in zip(multi["speedup_best"], single["speedup_best"])]
    correct = [m - s for m, s in zip(multi["correct_best"], single["correct_best"])]
    return {"allocation": allocation, "speedup_best_diff": spread(speed), "correct_best_diff": spread(correct),
            "seeds_multi_ahead": sum(d > 0 for d in speed), "seeds": len(speed),
            "multi_beat_single": spread(speed)[0] > 0}


def markdown(agg: dict, training: dict, verdicts: list[dict], settings: dict, command: str) -> str:
    """The whole report: the command, the training curves' start and end, the allocations at the budget, the serial
    and the parallel curves, and the verdict in words."""
    f = f"fast_{THRESHOLD}"
    lines = [f"# Kevin's comparison at toy scale ({settings['device']})", "", f"    {command}", "",
             f"Policy: the warm-started small policy ({settings['policy']}), which has also seen "
             f"{settings['wrong_misses']} near misses of its correct kernels ({settings['near_misses']} drawn from "
             "each, one line dropped, judged wrong by the evaluator) followed, after their real feedback, by the fix. "
             f"Training: {settings['seeds']} seeds, "
             f"{settings['steps']} GRPO steps on {settings['train_tasks']}, multi-turn {settings['multi']} vs "
             f"single-turn {settings['single']} trajectories x turns a task ({settings['kernels_per_step']} kernels a "
             f"task a step each). Held-out: {settings['heldout_tasks']}, pools of {settings['pool']} trajectories x "
             f"{settings['eval_turns']} turns a task. Every cell: mean ± std over seeds.", "",
             "## Training (train tasks): mean turn score, first step -> last step", "",
             "| policy | score first | score last | correct first | correct last |", "|---|---|---|---|---|"]
    for kind in ("multi", "single"):
        t = training[kind]
        lines.append(f"| {LABELS[kind]} | {cell(t['score_first'], unit='')} | {cell(t['score_last'], unit='')} | "
                     f"{cell(t['correct_first'], True)} | {cell(t['correct_last'], True)} |")
    allocations = list(agg["warm"]["allocations"])
    lines += ["", f"## Held-out, {settings['budget']} kernels a task: every allocation (n trajectories x T turns, "
              "k = n)", "", "| policy | n x T | correct best@k | correct avg | speedup best@k | mean speedup | "
              f"{f} |", "|---|---|---|---|---|---|---|"]
    for kind in KINDS:
        for a in allocations:
            m = agg[kind]["allocations"][a]
            lines.append(f"| {LABELS[kind]} | {a.replace('x', ' x ')} | {cell(m['correct_best'], True)} | "
                         f"{cell(m['correct_avg'], True)} | {cell(m['speedup_best'])} | {cell(m['speedup_avg'])} | "
                         f"{cell(m[f], True)} |")
    lines += ["", "## Held-out, serial: one trajectory (k = 1) cut to its first T turns", "",
              "| T | " + " | ".join(f"{LABELS[k]}: correct, mean speedup, {f}" for k in KINDS) + " |",
              "|---|" + "---|" * len(KINDS)]
    for i in range(len(agg["warm"]["per_turn"])):
        lines.append(f"| {i + 1} | " + " | ".join(
            f"{cell(agg[k]['per_turn'][i]['correct_avg'], True)}, {cell(agg[k]['per_turn'][i]['speedup_avg'])}, "
            f"{cell(agg[k]['per_turn'][i][f], True)}" for k in KINDS) + " |")
    lines += ["", "## Held-out, parallel: best of k single-turn trajectories", "",
              "| k | " + " | ".join(f"{LABELS[k]}: correct best@k, speedup best@k, {f}" for k in KINDS) + " |",
              "|---|" + "---|" * len(KINDS)]
    for i in range(len(agg["warm"]["per_k"])):
        lines.append(f"| {i + 1} | " + " | ".join(
            f"{cell(agg[k]['per_k'][i]['correct_best'], True)}, {cell(agg[k]['per_k'][i]['speedup_best'])}, "
            f"{cell(agg[k]['per_k'][i][f], True)}" for k in KINDS) + " |")
    lines += ["", "## Verdict", ""]
    for v in verdicts:
        (d, ds), (c, cs) = v["speedup_best_diff"], v["correct_best_diff"]
        beat = "beat" if v["multi_beat_single"] else "did not beat"
        lines.append(f"- {v['allocation'].replace('x', ' x ')}: multi-turn RL {beat} single-turn RL on held-out "
                     f"speedup best@k: multi - single {d:+.2f}x ± {ds:.2f} (multi ahead in "
                     f"{v['seeds_multi_ahead']} of {v['seeds']} seeds); correct best@k {c:+.0%} ± {cs:.0%}.")
    for kind in KINDS:
        first, last = agg[kind]["per_turn"][0]["correct_avg"], agg[kind]["per_turn"][-1]["correct_avg"]
        m, sd = spread([b - a for a, b in zip(first, last)])
        lines.append(f"- refinement, {LABELS[kind]}: one trajectory correct by turn {len(agg[kind]['per_turn'])} "
                     f"minus by turn 1 {m:+.0%} ± {sd:.0%}.")
    return "\n".join(lines) + "\n"


def plot(agg: dict, runs: dict[str, list[list[dict]]], path: Path, budget: int) -> None:
    """Training score per step (multi vs single, each seed thin), held-out correctness and mean speedup per turn
    (k = 1), and speedup best@k at every allocation of the budget; bands and bars: ± std over seeds."""
    plt = pyplot()
    fig, (train_ax, correct_ax, speed_ax, alloc_ax) = plt.subplots(1, 4, figsize=(20, 4.2))
    plot_steps(train_ax, {LABELS[k]: [curves(m)["score_per_step"] for m in runs[k]] for k in ("multi", "single")},
               "mean turn score", "training (train tasks)")
    colours = {"warm": "tab:gray", "multi": "tab:blue", "single": "tab:orange"}
    for ax, metric, label in ((correct_ax, "correct_avg", "share correct"), (speed_ax, "speedup_avg", "mean speedup")):
        for kind in KINDS:
            points = [spread(row[metric]) for row in agg[kind]["per_turn"]]
            turns = range(1, len(points) + 1)
            ax.plot(turns, [m for m, _ in points], color=colours[kind], marker="o", label=LABELS[kind])
            ax.fill_between(turns, [m - s for m, s in points], [m + s for m, s in points], color=colours[kind],
                            alpha=0.2)
        ax.set(xlabel="turns (k = 1)", ylabel=label, title=f"held-out, serial: {label}")
        ax.legend()
    allocations = list(agg["warm"]["allocations"])
    width = 0.27
    for i, kind in enumerate(KINDS):
        points = [spread(agg[kind]["allocations"][a]["speedup_best"]) for a in allocations]
        alloc_ax.bar([x + (i - 1) * width for x in range(len(allocations))], [m for m, _ in points], width,
                     yerr=[s for _, s in points], color=colours[kind], label=LABELS[kind])
    alloc_ax.set(xticks=range(len(allocations)), xticklabels=[a.replace("x", " x ") for a in allocations],
                 xlabel="trajectories x turns", ylabel="speedup best@k", title=f"held-out, {budget} kernels a task")
    alloc_ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


# ---------------------------------------------------------------- the runs
def claim_out_dir(out: Path, policy_name: str) -> None:
    """Mark `out` as holding runs of this policy (out/policy.txt); refuse one whose runs another policy (or one not
    marked) made, which a re-run would otherwise take as finished."""
    marker = out / "policy.txt"
    if (out / "runs").exists() and (not marker.exists() or marker.read_text() != policy_name):
        raise SystemExit(f"--out-dir {out} holds runs of another policy than {policy_name}: give another --out-dir")
    marker.write_text(policy_name)


def trained(folder: Path, steps: int) -> bool:
    """Whether the train.py run in `folder` is finished: its metrics reach `steps` and its final model is saved."""
    return len(read_metrics(folder / "metrics.jsonl")) >= steps and (folder / "final").exists()


def train_runs(args, policy: Path, max_tokens: int, out: Path) -> dict[str, list[list[dict]]]:
    """Every training run, one at a time (train.py uses every core), skipping the finished ones."""
    runs = {"multi": [], "single": []}
    for seed in args.seed_list:
        for kind in ("multi", "single"):
            folder = out / "runs" / f"{kind}_seed{seed}"
            if not trained(folder, args.steps):
                folder.mkdir(parents=True, exist_ok=True)
                print(f"train: {folder.name}", file=sys.stderr, flush=True)
                with (folder / "train.log").open("w") as log:
                    done = subprocess.run(train_command(args, kind, seed, str(policy), max_tokens, folder), cwd=REPO,
                                          stdout=log, stderr=subprocess.STDOUT)
                if done.returncode:
                    raise SystemExit(f"train.py failed for {folder.name}: see {folder / 'train.log'}")
            runs[kind].append(read_metrics(folder / "metrics.jsonl")[:args.steps])
    return runs


def held_out_pool(args, model: Path, seed: int, max_tokens: int, path: Path) -> dict[str, list[list[dict]]]:
    """generate.py's --pool x --eval-turns trajectories of `model` on every held-out task (it resumes a cut file)."""
    command = [sys.executable, str(REPO / "generate.py"), "--model", str(model), "--tasks", args.heldout,
               "--device", args.device, "--n-trajectories", str(args.pool), "--turns", str(args.eval_turns),
               "--max-tokens", str(max_tokens), "--seed", str(seed), "--out", str(path)]
    tasks = len(list(Path(args.heldout).rglob("*.py")))
    if len(read_metrics(path)) < tasks * args.pool:
        print(f"held-out pool: {path.name}", file=sys.stderr, flush=True)
        with path.with_suffix(".log").open("w") as log:
            if subprocess.run(command, cwd=REPO, stdout=log, stderr=subprocess.STDOUT).returncode:
                raise SystemExit(f"generate.py failed for {path.name}: see {path.with_suffix('.log')}")
    return scale_test.group_pools(read_metrics(path))


# ---------------------------------------------------------------- config
def parse_args(argv=None) -> argparse.Namespace:
    import torch

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", choices=["cuda", "cpu"], default=None,
                   help="cuda: CUDA kernels on the GPU; cpu: C++ kernels (default: cuda with a GPU, cpu without)")
    p.add_argument("--out-dir", default=None, help="every run and pool (default: runs/kevin_table_<device>)")
    p.add_argument("--results", default=None,
                   help="where kevin_table_<device>.md and .png go (default: --out-dir; `results` for the kept copies)")
    # training
    p.add_argument("--seeds", type=int, default=3, help="seeds: each trains one multi- and one single-turn run")
    p.add_argument("--steps", type=int, default=8, help="GRPO steps per run")
    p.add_argument("--n-trajectories", type=int, default=2,
                   help="multi-turn: trajectories per task (single-turn: n-trajectories x turns, 1 turn)")
    p.add_argument("--turns", type=int, default=4, help="multi-turn: turns per trajectory in training")
    p.add_argument("--lr", type=float, default=5e-5, help="GRPO learning rate (train.py's default for this policy)")
    p.add_argument("--near-misses", type=int, default=3,
                   help="warm start: near misses of each correct library kernel, judged for real, whose feedback is "
                        "followed by the fix (warm_start.py --near-misses; 0: the policy train.py starts from)")
    p.add_argument("--train-args", default="", help="more train.py flags for every run")
    # held-out evaluation
    p.add_argument("--pool", type=int, default=8, help="trajectories per held-out task and policy (parallel, up to k)")
    p.add_argument("--eval-turns", type=int, default=8, help="turns per held-out trajectory (serial)")
    p.add_argument("--budget", type=int, default=8,
                   help="kernels per held-out task of every allocation (n x T, n up to --pool, T up to --eval-turns)")
    args = p.parse_args(argv)
    args.device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    for flag in ("seeds", "steps", "n_trajectories", "turns", "pool", "eval_turns", "budget"):
        if getattr(args, flag) < 1:
            raise SystemExit(f"--{flag.replace('_', '-')} must be at least 1")
    if args.near_misses < 0:
        raise SystemExit("--near-misses must be at least 0")
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda but no GPU is visible")
    args.out_dir = Path(args.out_dir or REPO / "runs" / f"kevin_table_{args.device}")
    args.results = Path(args.results or args.out_dir)
    args.seed_list = list(range(1, args.seeds + 1))
    return args


def command_line(argv: list[str]) -> str:
    """How this report was made, as a command to type in the repository."""
    return " ".join(["python bench/kevin_table.py", *argv])


# ---------------------------------------------------------------- the run
def main(argv=None) -> None:
    """The table. A Ctrl-C stops the run under way and says in one line what is kept (exit status 130)."""
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # subprocess.run then kills the run under way
    started()  # from here on, a Ctrl-C is main's to report
    try:
        make_table(args, argv)
    except KeyboardInterrupt:
        runs = args.out_dir / "runs"
        done = sum(trained(runs / f"{kind}_seed{seed}", args.steps)
                   for seed in args.seed_list for kind in ("multi", "single"))
        print(f"interrupted: {done} of {2 * args.seeds} training runs finished in {runs}, the held-out pools kept as "
              f"far as written in {args.out_dir / 'pools'}; the same command goes on from there", file=sys.stderr)
        raise SystemExit(130) from None


def make_table(args, argv: list[str]) -> None:
    """Warm start, training, held-out pools, scoring, the report."""
    from kevin import warm_policy
    from kevin.tasks import load_tasks

    began = time.time()
    out = args.out_dir
    out.mkdir(parents=True, exist_ok=True)
    policy = warm_policy.policy(args.device, near_misses=args.near_misses)
    claim_out_dir(out, policy.name)
    report = json.loads((policy / "warm_start.json").read_text())
    max_tokens = report["longest_reply_tokens"] + 32
    args.tasks = str(warm_policy.DEFAULT_TASKS[args.device])
    args.heldout = str(warm_policy.HELDOUT_TASKS[args.device])
    args.tasks_per_step = len(load_tasks(args.tasks, None))
    train_ids = {t.id for t in load_tasks(args.tasks, None)}
    heldout_ids = {t.id for t in load_tasks(args.heldout, None)}
    if train_ids & heldout_ids:
        raise SystemExit(f"held-out tasks {sorted(train_ids & heldout_ids)} are also trained on")

    runs = train_runs(args, policy, max_tokens, out)
    reports: dict[str, dict[int, dict]] = {kind: {} for kind in KINDS}
    (out / "pools").mkdir(exist_ok=True)
    for seed in args.seed_list:
        for kind in KINDS:
            model = policy if kind == "warm" else out / "runs" / f"{kind}_seed{seed}" / "final"
            pools = held_out_pool(args, model, seed, max_tokens, out / "pools" / f"{kind}_seed{seed}.jsonl")
            reports[kind][seed] = seed_report(pools, args.budget, args.eval_turns, args.pool)

    agg = aggregate(reports)
    training = {kind: {key: [f(m) for m in runs[kind]] for key, f in (
        ("score_first", lambda m: m[0]["reward/score"]), ("score_last", lambda m: m[-1]["reward/score"]),
        ("correct_first", lambda m: m[0]["reward/correct"]), ("correct_last", lambda m: m[-1]["reward/correct"]))}
        for kind in ("multi", "single")}
    allocations = list(agg["warm"]["allocations"])
    verdicts = [verdict(agg, a) for a in allocations]
    n, t = args.n_trajectories, args.turns
    settings = {"device": args.device, "policy": warm_policy.shown(policy), "seeds": args.seeds, "steps": args.steps,
                "train_tasks": ", ".join(sorted(train_ids)), "multi": f"{n} x {t}", "single": f"{n * t} x 1",
                "kernels_per_step": n * t, "near_misses": args.near_misses,
                "wrong_misses": sum(m["status"] != "correct" for m in report.get("near_misses", [])),
                "heldout_tasks": ", ".join(sorted(heldout_ids)), "pool": args.pool,
                "eval_turns": args.eval_turns, "budget": args.budget}
    text = markdown(agg, training, verdicts, settings, command_line(argv))
    results = args.results
    results.mkdir(parents=True, exist_ok=True)
    (results / f"kevin_table_{args.device}.md").write_text(text)
    plot(agg, runs, results / f"kevin_table_{args.device}.png", args.budget)
    (out / "kevin_table.json").write_text(json.dumps(repo_relative({
        "settings": settings, "held_out": agg, "training": training, "verdicts": verdicts,
        "seconds": round(time.time() - began, 1)}), indent=1))
    print(text)
    print(f"table: {results / f'kevin_table_{args.device}.md'}   plot: {results / f'kevin_table_{args.device}.png'}")


if __name__ == "__main__":
    quiet_ctrl_c_while_starting("before any run")
    main()
