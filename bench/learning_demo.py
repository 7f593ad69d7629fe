"""Does the whole loop improve a policy on real evaluations? Warm-start a small model on a library of
kernel variants (warm_start.py), then train it with multi-turn GRPO (train.py, n trajectories x T turns)
and, beside it, with single-turn GRPO at the same number of kernels per step (n*T trajectories x 1
turn), for several seeds; report the mean turn score at the start and at the end, and per turn.

A check of the machinery on a toy policy, not the paper's result: the policy has memorised a dozen
hand-written kernels (solutions/warm_start/) and RL can only learn which of them to write, and what to
write after the evaluator's feedback; but every kernel it writes is compiled, checked and timed by
evaluate.py for real, and the rewards, advantages and updates are train.py's own. The CUDA library's
tasks are 1/8-size copies of three elementwise tasks (solutions/warm_start/tasks/), so that checking
and timing a kernel takes seconds; their speedups are noisier than on the full-size tasks.

    python bench/learning_demo.py --out-dir runs/learning_demo          # GPU machine: 3 seeds, 2x4 vs 8x1 per task
    python bench/learning_demo.py --device cpu --seeds 1 --turns 2 --n-trajectories 4 \
        --ws-layers 2 --ws-epochs 40 --out-dir runs/learning_demo_cpu   # C++ kernels on tests/tasks

Every step samples every task (by default), so that steps compare: the tasks differ in how fast their
fastest kernel is. Start = the mean over the first --window steps (the first step's rollouts come from
the warm-started policy itself), end = the mean over the last --window steps. The GRPO learning rate
is far above the paper's 2e-6: the policy is a few million parameters and has a few steps; much higher
and the updates blur the memorised kernels (entropy and new kernels rise). Runs go at once, up to
--parallel, each on one GPU (round robin over the visible ones); a run whose metrics file is complete is
not run again, and one that was cut short goes on from its last checkpoint (every 2 steps): after a Ctrl-C, which
says in one line what is kept, the same command goes on from there. The warm start is
warm_policy.policy's, made once for its settings and cached in .cache/warm_start/. Output in --out-dir:
runs/<multi|single>_seed<k>/ (train.py's metrics, log, model), learning_demo.json (every number, and how many
new kernels had to be compiled during GRPO) and learning_demo.png (score per step, score per turn).
"""
import argparse
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BUILDS = REPO / ".cache" / "builds"  # evaluate.py's default build cache, which train.py uses
from kevin.learning_curves import curves, mean, plot_steps, pyplot, turns_of  # noqa: E402
from kevin.startup import quiet_ctrl_c_while_starting, started  # noqa: E402


def repo_relative(value):
    """A JSON value with every absolute path in it made relative to the repository, or None where it lies
    outside: a report names no folder of the machine that made it."""
    if isinstance(value, dict):
        return {k: repo_relative(v) for k, v in value.items()}
    if isinstance(value, list):
        return [repo_relative(v) for v in value]
    if isinstance(value, str) and os.path.isabs(value):
        path = Path(value).resolve()
        return str(path.relative_to(REPO)) if path.is_relative_to(REPO) else None
    return value


# ---------------------------------------------------------------- commands
def warm_started(args) -> Path:
    """--warm-model, else warm_policy.policy with the --ws-* settings: made once, then taken from its cache."""
    if args.warm_model:
        return Path(args.warm_model)
    from kevin import warm_policy

    return warm_policy.policy(args.device, library=Path(args.library), tasks=Path(args.tasks), turns=args.turns,
                             epochs=args.ws_epochs, layers=args.ws_layers, hidden=args.ws_hidden, lr=args.ws_lr)


def train_command(args, kind: str, seed: int, model: str, max_tokens: int, out: Path) -> list[str]:
    """train.py for one run: `multi` is n trajectories x T turns, `single` n*T trajectories x 1 turn (same kernels)."""
    n, turns = (args.n_trajectories, args.turns) if kind == "multi" else (args.n_trajectories * args.turns, 1)
    return [sys.executable, str(REPO / "train.py"), "--model", model, "--tasks", args.tasks,
            "--tasks-per-step", str(args.tasks_per_step), "--n-trajectories", str(n), "--turns", str(turns),
            "--steps", str(args.steps), "--lr", str(args.lr), "--max-tokens", str(max_tokens),
            "--device", args.device, "--seed", str(seed), "--save-every", "2", "--no-bf16",
            "--out", str(out), "--log", str(out / "metrics.jsonl"),
            *go_on_or_afresh(out), *shlex.split(args.train_args)]


def go_on_or_afresh(out: Path) -> list[str]:
    """train.py's flag for a run into `out`: --resume where a whole checkpoint is there to go on from, else
    --overwrite (a run cut short before its first checkpoint starts afresh; a fresh folder holds nothing to delete)."""
    return ["--resume"] if any((out / "checkpoints").glob("step_*/trainer_state.json")) else ["--overwrite"]


def read_metrics(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


# ---------------------------------------------------------------- summaries
def summarise(metrics: list[dict], window: int) -> dict:
    """Start and end of one run: mean turn score, correctness and per-turn scores over the first and last `window`
    steps, and its curves (kevin/learning_curves.py)."""
    first, last = metrics[:window], metrics[-window:]
    turns = turns_of(metrics)
    return {"steps": len(metrics),
            "score_start": mean(m["reward/score"] for m in first), "score_end": mean(m["reward/score"] for m in last),
            "correct_start": mean(m["reward/correct"] for m in first),
            "correct_end": mean(m["reward/correct"] for m in last),
            "turn_start": [mean(m[f"reward/score_turn{t}"] for m in first) for t in turns],
            "turn_end": [mean(m[f"reward/score_turn{t}"] for m in last) for t in turns],
            **curves(metrics)}


def table(runs: dict[str, dict], seeds: list[int]) -> str:
    """Per seed and their mean: the multi-turn run's mean turn score and share correct, start -> end, and its
    score per turn at the end; the single-turn run's beside it."""
    multi, single = [runs[f"multi_seed{s}"] for s in seeds], [runs[f"single_seed{s}"] for s in seeds]
    turns = len(multi[0]["turn_end"])

    def averaged(group: list[dict]) -> dict:
        keys = ("score_start", "score_end", "correct_start", "correct_end")
        return {**{k: mean(r[k] for r in group) for k in keys},
                "turn_end": [mean(r["turn_end"][t] for r in group) for t in range(len(group[0]["turn_end"]))]}

    def cells(r: dict) -> str:
        return (f"{r['score_start']:>6.3f} {r['score_end']:>6.3f} {r['score_end'] - r['score_start']:>+6.3f} "
                f"{r['correct_start']:>8.0%} {r['correct_end']:>6.0%}")

    head = f"{'start':>6} {'end':>6} {'rise':>6} {'correct:':>8} {'end':>6}"
    lines = [f"{'':>4} | {'multi-turn: score, share correct':<34} | {'end, per turn':<{8 * turns}} | "
             "single-turn: score, share correct",
             f"{'seed':>4} | {head} | " + "".join(f"{'turn ' + str(t + 1):>8}" for t in range(turns)) + f" | {head}"]
    for name, m, o in [(str(s), m, o) for s, m, o in zip(seeds, multi, single)] + [("mean", averaged(multi),
                                                                                      averaged(single))]:
        lines.append(f"{name:>4} | {cells(m)} | " + "".join(f"{s:>8.3f}" for s in m["turn_end"]) + f" | {cells(o)}")
    return "\n".join(lines)


def plot(runs: dict[str, dict], seeds: list[int], path: Path) -> None:
    """Mean turn score and share correct per step, multi- and single-turn, each seed thin and their mean
    thick; then the multi-turn policy's score per turn at the start and at the end, the single-turn end as a line."""
    plt = pyplot()
    fig, (score, correct, per_turn) = plt.subplots(1, 3, figsize=(15, 4))
    for ax, key, label in ((score, "score_per_step", "mean turn score"), (correct, "correct_per_step", "share correct")):
        plot_steps(ax, {f"{kind}-turn": [runs[f"{kind}_seed{s}"][key] for s in seeds] for kind in ("multi", "single")},
                   label, f"{label}, from the warm-started policy")
    multi = [runs[f"multi_seed{s}"] for s in seeds]
    turns = range(1, len(multi[0]["turn_end"]) + 1)
    width = 0.38
    per_turn.bar([t - width / 2 for t in turns], [mean(r["turn_start"][t - 1] for r in multi) for t in turns], width,
                 label="multi-turn, start", color="tab:blue", alpha=0.4)
    per_turn.bar([t + width / 2 for t in turns], [mean(r["turn_end"][t - 1] for r in multi) for t in turns], width,
                 label="multi-turn, end", color="tab:blue")
    per_turn.axhline(mean(runs[f"single_seed{s}"]["score_end"] for s in seeds), color="tab:orange", linestyle="--",
                     label="single-turn, end")
    per_turn.set(xlabel="turn", ylabel="mean score", title="score per turn", xticks=list(turns))
    per_turn.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def new_builds(since: float) -> int:
    """Extensions whose build folder appeared after `since`: the distinct kernels that had to be compiled."""
    if not BUILDS.exists():
        return 0
    return sum(1 for d in BUILDS.iterdir() if d.is_dir() and len(d.name) == 20 and d.stat().st_ctime > since)


def run_all(args, names: list[str], todo: list[str], running: dict, failed: list[str], model: Path, out: Path,
            bar) -> None:
    """Start train.py runs until --parallel are going (each on the next GPU in turn) until all have finished;
    `running` holds the live ones, `failed` gets the names of those that exited with an error."""
    while todo or running:
        while todo and len(running) < args.parallel:
            name = todo.pop(0)
            kind, seed = name.split("_seed")
            run_dir = out / "runs" / name
            run_dir.mkdir(parents=True, exist_ok=True)
            env = dict(os.environ)
            if args.device == "cuda":
                env["CUDA_VISIBLE_DEVICES"] = args.gpu_ids[names.index(name) % len(args.gpu_ids)]
            log = (run_dir / "train.log").open("w")
            command = train_command(args, kind, int(seed), str(model), args.max_tokens, run_dir)
            running[name] = (subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=REPO), log)
        time.sleep(2)
        for name, (process, log) in list(running.items()):
            if process.poll() is not None:
                log.close()
                del running[name]
                if process.returncode:
                    failed.append(name)
        done = sum(min(args.steps, len(read_metrics(out / "runs" / n / "metrics.jsonl"))) for n in names)
        if done > bar.n:
            bar.update(done - bar.n)


# ---------------------------------------------------------------- config
def parse_args(argv=None) -> argparse.Namespace:
    import torch

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", choices=["cuda", "cpu"], default=None,
                   help="cuda: CUDA library, kernels run on the GPU; cpu: C++ library on tests/tasks (default: cuda "
                        "with a GPU, cpu without)")
    p.add_argument("--out-dir", default=str(REPO / "runs" / "learning_demo"), help="where everything is written")
    p.add_argument("--library", default=None, help="variant library (default: solutions/warm_start/<device>)")
    p.add_argument("--tasks", default=None, help="task folder (default: solutions/warm_start/tasks for cuda, "
                   "tests/tasks for cpu)")
    # warm start
    p.add_argument("--warm-model", default=None, help="a warm-started model to use instead of running warm_start.py")
    p.add_argument("--ws-epochs", type=int, default=60, help="warm start: passes over the examples")
    p.add_argument("--ws-layers", type=int, default=4, help="warm start: transformer layers of the fresh model")
    p.add_argument("--ws-hidden", type=int, default=256, help="warm start: hidden size of the fresh model")
    p.add_argument("--ws-lr", type=float, default=3e-3, help="warm start: peak learning rate")
    # GRPO
    p.add_argument("--seeds", type=int, default=3, help="seeds, each with a multi-turn and a single-turn run")
    p.add_argument("--steps", type=int, default=6, help="GRPO steps per run")
    p.add_argument("--n-trajectories", type=int, default=2, help="multi-turn: trajectories per task (single-turn: "
                   "n-trajectories x turns)")
    p.add_argument("--turns", type=int, default=4, help="multi-turn: turns per trajectory")
    p.add_argument("--tasks-per-step", type=int, default=None,
                   help="tasks per GRPO step (default: all of --tasks, so that every step scores the same tasks)")
    p.add_argument("--lr", type=float, default=5e-5, help="GRPO peak learning rate (paper: 2e-6, for a 32B model)")
    p.add_argument("--max-tokens", type=int, default=None,
                   help="most reply tokens (default: the warm start's longest library reply + 32)")
    p.add_argument("--train-args", default="", help="more train.py flags for every run, e.g. \"--group-by task-turn\"")
    p.add_argument("--window", type=int, default=2, help="steps averaged for the start and for the end")
    p.add_argument("--parallel", type=int, default=None,
                   help="runs at once (default: all of them with a GPU, 1 without)")
    args = p.parse_args(argv)
    gpus = torch.cuda.device_count()
    args.device = args.device or ("cuda" if gpus else "cpu")
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")  # a child's ids must name the GPUs this process sees
    args.gpu_ids = visible.split(",")[:gpus] if visible else [str(i) for i in range(gpus)]
    args.library = args.library or str(REPO / "solutions" / "warm_start" / args.device)
    args.tasks = args.tasks or str(REPO / ("solutions/warm_start/tasks" if args.device == "cuda" else "tests/tasks"))
    if args.tasks_per_step is None:
        from kevin.tasks import index_tasks

        args.tasks_per_step = len(index_tasks(args.tasks))
    args.parallel = args.parallel or (2 * args.seeds if args.device == "cuda" else 1)
    for flag in ("seeds", "steps", "n_trajectories", "turns", "tasks_per_step", "window", "parallel", "ws_epochs"):
        if getattr(args, flag) < 1:
            raise SystemExit(f"--{flag.replace('_', '-')} must be at least 1")
    if args.window > args.steps:
        raise SystemExit(f"--window {args.window} is more than --steps {args.steps}")
    if args.device == "cuda" and not gpus:
        raise SystemExit("--device cuda but no GPU is visible")
    return args


# ---------------------------------------------------------------- the run
def main(argv=None) -> None:
    """The demo. A Ctrl-C stops the runs under way and says in one line what is kept (exit status 130)."""
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so that the runs it started are stopped too
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    names = [f"{kind}_seed{s}" for kind in ("multi", "single") for s in range(1, args.seeds + 1)]
    started()  # from here on, a Ctrl-C is main's to report
    try:
        demo(args, out, names)
    except KeyboardInterrupt:
        finished = sum(len(read_metrics(out / "runs" / name / "metrics.jsonl")) >= args.steps for name in names)
        print(f"interrupted: {finished} of {len(names)} GRPO runs finished in {out / 'runs'}; the same command goes on "
              "from there (a run cut short from its last checkpoint)", file=sys.stderr)
        raise SystemExit(130) from None


def demo(args, out: Path, names: list[str]) -> None:
    """Warm start, the GRPO runs (`names`: multi- and single-turn, longest first, so GPUs get a mix), the report."""
    from tqdm import tqdm

    began = time.time()

    # ------------------------------------------------ warm start, once
    model = warm_started(args)
    if not (model / "config.json").exists():
        raise SystemExit(f"--warm-model {model}: no model there (config.json)")
    report = model / "warm_start.json"
    if args.max_tokens is None:
        if not report.exists():
            raise SystemExit(f"--max-tokens is needed: {report} does not exist")
        args.max_tokens = json.loads(report.read_text())["longest_reply_tokens"] + 32
    warm_s = time.time() - began

    # ------------------------------------------------ GRPO runs, several at once
    seeds = list(range(1, args.seeds + 1))
    todo = [name for name in names if len(read_metrics(out / "runs" / name / "metrics.jsonl")) < args.steps]
    rl_started = time.time()
    running: dict[str, tuple[subprocess.Popen, object]] = {}
    failed = []
    bar = tqdm(total=len(names) * args.steps, desc="GRPO runs", unit="step", file=sys.stderr)
    try:
        run_all(args, names, todo, running, failed, model, out, bar)
    finally:  # an interrupted demo leaves no training behind
        for process, log in running.values():
            process.terminate()
            log.close()
        bar.close()
    if failed:
        raise SystemExit(f"train.py failed for {', '.join(failed)}: see {out / 'runs' / failed[0] / 'train.log'}")

    # ------------------------------------------------ summary
    runs = {name: summarise(read_metrics(out / "runs" / name / "metrics.jsonl"), args.window) for name in names}
    print(table(runs, seeds))
    multi_rises = [runs[f"multi_seed{s}"]["score_end"] - runs[f"multi_seed{s}"]["score_start"] for s in seeds]
    later_higher = [mean(runs[f"multi_seed{s}"]["turn_end"][1:]) > runs[f"multi_seed{s}"]["turn_end"][0] for s in seeds]
    builds = new_builds(rl_started)
    print(f"multi-turn score rose in {sum(r > 0 for r in multi_rises)} of {len(seeds)} seeds; later turns beat the "
          f"first at the end in {sum(later_higher)} of {len(seeds)}; {builds} new kernels compiled during GRPO; "
          f"warm start {warm_s:.0f} s, GRPO {time.time() - rl_started:.0f} s")
    plot(runs, seeds, out / "learning_demo.png")
    (out / "learning_demo.json").write_text(json.dumps(repo_relative({
        "config": vars(args), "warm_model": str(model.resolve()),
        "warm_start": json.loads(report.read_text()) if report.exists() else None,
        "runs": runs, "new_kernels_compiled_during_grpo": builds,
        "seconds": {"warm_start": round(warm_s, 1), "grpo": round(time.time() - rl_started, 1)}}), indent=1))
    print(f"plot: {out / 'learning_demo.png'}   numbers: {out / 'learning_demo.json'}")


if __name__ == "__main__":
    quiet_ctrl_c_while_starting("before any run")
    main()
