"""Compile, check and time candidate kernels against a task's PyTorch reference.

A candidate is a Python module defining `ModelNew` whose work is done by native code it builds with
`torch.utils.cpp_extension.load_inline` (CUDA on a GPU; C++ with `--device cpu`, so the whole pipeline
also runs where no GPU exists). Each candidate gets a status, a speedup and the feedback text the model
reads on its next turn (the five kinds of the Kevin paper, plus `rejected` and `timeout`).

Pipeline, per call of `evaluate(records)` (or per submission to an `Evaluator`, which judges them as they come):
  1. parse: the last fenced code block of a reply (or the record's code as is); the static rules of --rules,
     the paper's (no try/except, no `pass`, no torch.nn layers / functional / torch compute ops, a native
     kernel) or KernelBench's (the same, but PyTorch ops and torch.nn layers allowed).
  2. build: every distinct candidate is imported in a child process from a pool sized to the cores, with
     load_inline redirected to a content-addressed build cache of light, precompiled torch headers, so that
     an extension repeated across a GRPO group or a later turn is compiled once and fast (kevin/build_cache.py).
  3. judge: per GPU, a fresh pair of processes per candidate, set up (CUDA contexts and all) while the ones
     before it run: the runner, sandboxed, imports the candidate and runs it on request; the judge, which
     never imports candidate code, draws the inputs, runs the reference, compares (shape, dtype, NaN/Inf,
     tolerance, the error's scale), times the reference with the runner stopped and watches the candidate's
     calls from outside, and decides (kevin/judge.py: what runs where, and why).
  A crash, illegal memory access, `sys.exit` or hang kills only that candidate's runner; the result says so
  (kevin/isolation.py).

This file is the command line; the evaluator itself (config, feedback, the scheduler `Evaluator`) is
kevin/evaluator.py, which the other stages share, and its machinery lives in helper modules named for what they do: kevin/static_rules.py (parsing and
the static rules), kevin/judge.py (the verdict), kevin/runner.py (the runner: the candidate's process),
kevin/harness.py (what both run: the timer, the profiler), kevin/tensor_exchange.py (the outputs between them),
kevin/eval_children.py (the children's settings and what
their output comes down to),
kevin/eval_records.py (the JSONL in and out, and what a resumed run goes on from), kevin/config_flags.py (one flag per
EvalConfig field), kevin/build_cache.py and kevin/isolation.py; none imports this one.

Defaults follow the KernelBench version Kevin used (atol = rtol = 1e-2, seed 42 before building each
model so parameters made the same way match); where the paper is silent (number of correctness inputs,
timing protocol, how far repeated runs may differ) the choices are flags documented in the README.
`--rules kernelbench` judges as KernelBench does instead (its tolerances per dtype; PyTorch allowed for what
the candidate does not replace), with every runtime defence kept.

Usage:
  python evaluate.py IN.jsonl > OUT.jsonl        # records with `task` and `code`; `-` reads stdin
  python evaluate.py IN.jsonl -o OUT.jsonl       # appends as results finish; a re-run resumes
  python evaluate.py                              # the hand-written kernels in solutions/, GPU if any
  python evaluate.py IN.jsonl -o OUT.jsonl --ray auto   # on the nodes of a Ray cluster (docs/cluster.md)
"""
from __future__ import annotations

from kevin.startup import freeze_at_exit, quiet_ctrl_c_while_starting, started

if __name__ == "__main__":
    quiet_ctrl_c_while_starting("before evaluating anything")
    freeze_at_exit()

import argparse
import json
import math
import os
import signal
import sys
from pathlib import Path

from kevin.dependencies import require

require("torch")


from kevin.config_flags import add_config_flags, config_from, given_flags
from kevin.eval_records import already_written, library_records, open_output, read_records
from kevin.evaluator import ROOT, STATUSES, EvalConfig, evaluate, resolve_device
from kevin.tasks import index_tasks, resolve_task

# ----------------------------------------------------------------------------------------------------
# Command line


def summary_table(evals: list[dict], records: list[dict], first: int = 1) -> str:
    """One row per candidate (for small runs), counts per status, then speedups over the correct ones. A row names
    its candidate by its `solution` where the record has one, else by its task and its number in the input (the
    first of `records` is number `first`): the replies to one task must be told apart."""
    if not evals:
        return "no rows: no candidates were evaluated"
    lines = []
    if len(evals) <= 40:
        lines += ["| candidate | status | speedup | runtime ms | eager ms |", "|---|---|---|---|---|"]
        for number, (record, e) in enumerate(zip(records, evals), first):
            name = record.get("solution") or f"{record['task']}, record {number}"
            fmt = lambda v: f"{v:.3f}" if isinstance(v, float) else "-"  # noqa: E731
            lines.append(f"| {name} | {e['status']} | {fmt(e['speedup'])} | {fmt(e['runtime_ms'])} "
                         f"| {fmt(e['ref_runtime_ms'])} |")
        lines.append("")
    counts = {s: sum(e["status"] == s for e in evals) for s in STATUSES}
    speedups = [e["speedup"] for e in evals if e["correct"]]
    lines += ["| status | count |", "|---|---|"] + [f"| {s} | {n} |" for s, n in counts.items() if n]
    geomean = 0.0 if not speedups or min(speedups) == 0 else math.exp(sum(map(math.log, speedups)) / len(speedups))
    over_correct = f"geomean {geomean:.3f}x, max {max(speedups):.3f}x" if speedups else "-"
    lines += [f"| **total** | {len(evals)} |", "",
              f"correct: {len(speedups)}/{len(evals)}; speedup over correct: {over_correct}; faster than eager: "
              f"{sum(s > 1 for s in speedups)}"]
    return "\n".join(lines)


def _parser() -> argparse.ArgumentParser:
    """The input and output, then one flag per EvalConfig field (kevin/config_flags.py)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("input", nargs="?", help="JSONL of candidates (`task`, `code`); `-` for stdin; "
                   "default: the hand-written candidates in solutions/<device>/")
    p.add_argument("-o", "--out", help="append results here (resuming a run) instead of stdout; one run at a "
                   "time writes a file")
    add_config_flags(p, EvalConfig)
    return p


DEMO_RUN_TIMEOUT_S = 30.0


class OutputClosed(Exception):
    """What reads the results went away (`evaluate.py IN.jsonl | head -1`): the run ends quietly, as a Unix tool's."""


def _config(args: argparse.Namespace) -> EvalConfig:
    """The flags given, over EvalConfig's defaults (a bad value is a one-line error). On the CPU without --tasks,
    the CPU-sized copies of the tasks in tests/tasks/: the full-size ones take minutes a call on a CPU, and an
    honest kernel would come back `timeout` for the machine's size. The CPU demo (no input) also takes a run
    timeout that its candidates (each checked in seconds) never reach but its hanging one soon does."""
    given = given_flags(args, EvalConfig)
    cfg = config_from(args, EvalConfig)
    if "tasks" not in given and resolve_device(cfg)[0] == "cpu":
        cfg.tasks = str(ROOT / "tests" / "tasks")
        print("on the CPU: the CPU-sized tasks in tests/tasks/ (--tasks tasks for the full-size ones)", file=sys.stderr)
        if args.input is None and "run_timeout_s" not in given:  # its hanging candidate holds a core this long
            cfg.run_timeout_s = DEMO_RUN_TIMEOUT_S
    return cfg


def _input_records(source: str | None, cfg: EvalConfig) -> tuple[str, list[dict]]:
    """(where they came from, the records): the JSONL input, or else the hand-written candidates; every task
    id resolved up front, so that a typo stops the run before anything is built."""
    if source is None:
        kind, _ = resolve_device(cfg)
        source = f"solutions/{kind}"
        print(f"no input: evaluating the hand-written candidates in {source}/", file=sys.stderr)
        records = library_records(ROOT / "solutions" / kind)
    else:
        records = read_records(source)
    index = index_tasks(cfg.tasks) if Path(cfg.tasks).exists() else {}
    for number, record in enumerate(records, 1):
        try:
            resolve_task(str(record["task"]), index)
        except ValueError as e:
            if not Path(cfg.tasks).exists():  # what is unknown is the folder, not the task
                raise SystemExit(f"error: --tasks {cfg.tasks}: no such task file or folder") from None
            raise SystemExit(f"error: {source}: record {number}: {e}")
    return source, records


def main(argv=None):
    args = _parser().parse_args(argv)
    cfg = _config(args)
    _, records = _input_records(args.input, cfg)
    # The demo prints only its table unless asked to keep the records; a pipeline gets them on stdout. OUT is
    # locked before it is read: what it holds is this run's to go on from.
    out = open_output(args.out) if args.out else open(os.devnull, "w") if args.input is None else sys.stdout
    done = already_written(args.out, records) if args.out else 0
    if done:
        print(f"resuming: {done} of {len(records)} already in {args.out}", file=sys.stderr)
    pending, written = {}, []

    def write_in_order(i: int, result: dict):
        pending[i] = result
        while len(written) in pending:  # results come in any order; lines go out in input order
            result = pending.pop(len(written))
            try:
                out.write(json.dumps({**records[done + len(written)], "eval": result}) + "\n")
                out.flush()
            except BrokenPipeError:
                raise OutputClosed from None
            written.append(result)

    started()  # from here on, a Ctrl-C is main's to report
    try:
        evaluate(records[done:], cfg, on_result=write_in_order)
    except KeyboardInterrupt:  # evaluate has dropped what its stopped children would have said
        print(f"interrupted: {done + len(written)} of {len(records)} written; re-run to resume", file=sys.stderr)
        raise SystemExit(130) from None
    except OutputClosed:  # evaluate has stopped its children; what stdout still buffers goes nowhere, unreported
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        raise SystemExit(128 + signal.SIGPIPE) from None  # the status of a Unix tool that SIGPIPE ended
    finally:
        if out is not sys.stdout:
            out.close()
    print(summary_table(written, records[done:], first=done + 1), file=sys.stderr)


if __name__ == "__main__":
    main()
