"""Multi-turn rollouts: a model writes a kernel for each task, reads the evaluator's feedback, tries again.

For every task, n parallel trajectories each take T turns. At every turn all live trajectories of a
group of tasks are generated in one batch and evaluated in one batch (evaluate.py), and each reply's
code, its closing summary and the evaluator's feedback become a "previous attempt" in the next turn's
prompt. The prompt of every turn holds the task's PyTorch `Model`, the rules, a one-shot example
(turn 1 only), the previous attempts, and a request to restart the reasoning and write new complete
code. Earlier reasoning is dropped; only the summaries stay. With --overlap there is no barrier between
turns: a trajectory's next turn is generated as soon as its own kernel is judged, batched with the others
ready by then, while the rest still build and run; each reply has its own seed, so the records are the same.

Paper defaults (Kevin, arXiv 2507.11948): 16 trajectories, 4 turns (8 at evaluation), temperature
0.9, 16,384 reply tokens. The paper is silent on the prompt budget: 16,384 prompt tokens is the
default here; attempts that no longer fit are dropped earliest first.

Run:
  python generate.py --tasks tasks/level1 --out runs/rollouts.jsonl                 # tiny model, hf
  python generate.py --backend vllm --model Qwen/QwQ-32B --turns 8 --out runs/eval.jsonl
  python generate.py --backend openai --base-url http://localhost:8000/v1 --model my-model ...
  python generate.py --device cpu --max-tokens 64 ...   # C++ instead of CUDA, evaluated on a CPU
  python generate.py --out - ... | python reward.py - > runs/rewarded.jsonl   # JSONL on stdout
  VLLM_ENABLE_V1_MULTIPROCESSING=0 .venv-vllm/bin/python generate.py --backend vllm \
      --gpu-memory-utilization 0.3 --device cpu --max-tokens 64 ...   # vLLM's CPU build (docs/training.md)

Output: one JSON line per trajectory (see README, "Data formats", and docs/usage.md; turns numbered from 1), appended when
its group of tasks finishes; a re-run with the same --out skips the (task, trajectory) pairs already
written. --out's folder must exist, and a second run on an --out being written stops at once, as evaluate.py
-o does. A Ctrl-C drops the group under way and says in one line how many are written (exit status 130).
`--out -` (or a pipe) streams the lines to stdout instead, with nothing to resume; progress
and the summary table always go to stderr. The evaluation device is checked before anything is
generated, and a --model that is neither a local folder nor a cached or reachable hub id stops the run
before loading.

Simplifications: every trajectory runs all T turns (a correct kernel is told it can be made faster,
as in the paper). With --device cpu the rules ask for C++ (`load_inline` with `cpp_sources` only),
so the whole loop is meaningful without a GPU. The openai backend cannot see token ids: it records
none and estimates a prompt's length as characters / 4. The hf backend draws every reply's tokens on
the host, one random generator a reply, which suits small models and tests; use vllm for real runs.
"""

from __future__ import annotations

from kevin.startup import freeze_at_exit, quiet_ctrl_c_while_starting, started

if __name__ == "__main__":
    quiet_ctrl_c_while_starting("before writing anything")
    freeze_at_exit()

import argparse
import json
import os
import sys
from contextlib import contextmanager
from pathlib import Path

from kevin.dependencies import require

require("tqdm", "torch")

from tqdm import tqdm

from kevin.config_flags import add_config_flags, parse_config
from kevin.eval_records import open_output
from kevin.evaluator import EvalConfig
from kevin.rollout_config import GenerateConfig
from kevin.rollouts import kernel_device, make_backend, run_turns
from kevin.tasks import SPLITS, Task, load_tasks

# ---------------------------------------------------------------- tasks and output
def is_stream(out: str) -> bool:
    """'-', or something like /dev/stdout or a named pipe: written as it goes, never read back."""
    path = Path(out)
    return out == "-" or path.exists() and not path.is_file() and not path.is_dir()


def read_done(out: Path) -> list[dict]:
    """The trajectories already in `out`, blank lines skipped; a last line cut off by an interrupted write is
    removed. A line that is not a trajectory stops the run before anything is generated."""
    text = out.read_text()
    if text and not text.endswith("\n"):
        text = text[: text.rfind("\n") + 1]
        out.write_text(text)
    return [parse_record(line, f"{out}:{number}") for number, line in enumerate(text.splitlines(), 1)
            if line.strip()]


def parse_record(line: str, where: str) -> dict:
    """One trajectory line of an earlier run, or a one-line error naming the line."""
    try:
        record = json.loads(line)
    except json.JSONDecodeError as error:
        raise SystemExit(f"error: --out {where}: not JSON ({error.msg}); fix the line or pick another --out") from None
    if not isinstance(record, dict) or not {"task", "trajectory", "turns"} <= record.keys():
        raise SystemExit(f"error: --out {where}: not a generate.py trajectory (task, trajectory, turns); "
                         "an existing --out is resumed, so pick another file")
    return record


def summary_table(records: list[dict]) -> str:
    """Per turn (numbered from 1, by position, so files of any age read alike): kernels, share that compiled,
    share correct, mean speedup of the correct ones."""
    if not records:
        return "no rows: no trajectories to summarise"
    by_turn: dict[int, list[dict]] = {}
    for record in records:
        for number, turn in enumerate(record["turns"], 1):
            by_turn.setdefault(number, []).append(turn["eval"])
    lines = [f"{len(records)} trajectories of {len({r['task'] for r in records})} tasks, by turn:",
             f"{'turn':>4} {'kernels':>8} {'compiled':>9} {'correct':>8} {'mean speedup of correct':>24}"]
    for turn, evals in sorted(by_turn.items()):
        speedups = [e["speedup"] for e in evals if e["correct"]]
        mean = f"{sum(speedups) / len(speedups):.2f}x" if speedups else "-"
        lines.append(f"{turn:>4} {len(evals):>8} {sum(e['compiled'] for e in evals) / len(evals):>9.0%} "
                     f"{sum(e['correct'] for e in evals) / len(evals):>8.0%} {mean:>24}")
    return "\n".join(lines)


def _parser() -> argparse.ArgumentParser:
    """One flag per GenerateConfig field (kevin/config_flags.py); the splits on offer in the last line."""
    splits = ", ".join(json.loads(SPLITS.read_text())) if SPLITS.exists() else "none"
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                epilog=f"--split and --tasks take a split name of tasks/split.json ({splits})")
    add_config_flags(p, GenerateConfig)
    return p


def parse_args(argv=None) -> GenerateConfig:
    """The flags given, over GenerateConfig's defaults; a bad value is a one-line error."""
    return parse_config(_parser(), GenerateConfig, argv)


def roll_out(todo: list[tuple[Task, int]], backend, args: GenerateConfig, device: str):
    """Yield the finished trajectory records of each group of --tasks-per-batch tasks, all turns done."""
    eval_config = EvalConfig(device=device, gpus=args.gpus, rules=args.rules, ray=args.ray)
    size = (args.tasks_per_batch or len(todo)) * args.n_trajectories
    groups = [todo[i:i + size] for i in range(0, len(todo), size)]
    with tqdm(total=len(todo) * args.turns, desc="rollouts", unit="turn", file=sys.stderr) as progress:
        for group in groups:
            records = [{"task": task.id, "trajectory": k, "turns": []} for task, k in group]
            run_turns(records, [task for task, _ in group], backend, eval_config, turns=args.turns, seed=args.seed,
                      device=device, context_budget=args.context_budget, overlap=args.overlap, progress=progress)
            yield records


@contextmanager
def open_out(out: str, stream: bool):
    """stdout for '-', a stream as it is; else the file opened to append and locked, as evaluate.py's -o is (a second
    run on it stops at once instead of writing every trajectory again), and removed again if this run made it and
    wrote nothing (a run that fails before its first group leaves no empty file). A missing folder is an error."""
    if out == "-":
        yield sys.stdout
        return
    if stream:
        with open(out, "a") as f:
            yield f
        return
    if Path(out).is_dir():
        raise SystemExit(f"error: --out {out} is a folder; give a file, e.g. {Path(out) / 'rollouts.jsonl'}")
    made = not Path(out).exists()
    f = open_output(out)
    try:
        yield f
    finally:
        if made and f.tell() == 0:
            os.remove(out)  # while still locked: no other run can have opened it to write
        f.close()


def main(argv=None, backend=None) -> None:
    """Run from the command line; `backend` replaces the one --backend names (it must have the same methods). A
    Ctrl-C says in one line how many trajectories are written (a re-run goes on from there) and exits with 130."""
    args = parse_args(argv)
    tasks = load_tasks(args.tasks, args.split)
    device = kernel_device(args)
    stream = is_stream(args.out)
    with open_out(args.out, stream) as f:  # locked before it is read: what it holds is this run's to go on from
        earlier = [] if stream else read_done(Path(args.out))
        done = {(r["task"], r["trajectory"]) for r in earlier}
        todo = [(task, k) for task in tasks for k in range(args.n_trajectories) if (task.id, k) not in done]
        print(f"{len(tasks)} tasks x {args.n_trajectories} trajectories: {len(done)} already in {args.out}, "
              f"{len(todo)} to run (kernels for {device})", file=sys.stderr)
        started()  # from here on, a Ctrl-C is main's to report
        written = []
        try:
            if todo:
                backend = backend or make_backend(args)
                for records in roll_out(todo, backend, args, device):
                    f.write("".join(json.dumps(record) + "\n" for record in records))
                    f.flush()
                    written += records
            ids = {task.id for task in tasks}
            print(summary_table([r for r in earlier + written if r["task"] in ids]), file=sys.stderr)
        except KeyboardInterrupt:  # evaluate has stopped its children; a group cut short is not written
            total, resume = len(tasks) * args.n_trajectories, "" if stream else "; re-run to resume"
            print(f"interrupted: {total - len(todo) + len(written)} of {total} trajectories written{resume}",
                  file=sys.stderr)
            raise SystemExit(130) from None


if __name__ == "__main__":
    main()
