"""The hand-written candidates under both rule profiles: each one's status (and rule) with --rules kevin and
--rules kernelbench, side by side.

The candidates are those of solutions/<device>/ and tests/adversarial/<device>/ (CUDA with a GPU, C++
without), each file named after the status the paper's rules must give it. The table goes to stdout; --out
also writes every row, with each profile's feedback (paths relative to the repository), to a JSON file,
which --render turns back into the table.

    python bench/profiles.py --out results/profiles_h200.json
    python bench/profiles.py --render results/profiles_h200.json
"""
import argparse
import json
import re
from pathlib import Path

import torch

from kevin import evaluator as ev
from kevin.eval_records import library_records
from kevin.tasks import index_tasks
from kevin.eval_records import with_tasks_from  # noqa: E402

PROFILES = ("kevin", "kernelbench")


def verdict(result: dict) -> str:
    """The status, with the rule named first in the feedback for a rejection."""
    rule = re.search(r"\[([\w-]+)\]", result["feedback"]) if result["status"] == "rejected" else None
    return f"{result['status']} [{rule.group(1)}]" if rule else result["status"]


def render(report: dict) -> str:
    lines = [f"{len(report['rows'])} candidates on {report['device']}", "",
             "| candidate | kevin | kernelbench |", "|---|---|---|"]
    lines += [f"| {row['candidate']} | {row['kevin']['verdict']} | {row['kernelbench']['verdict']} |"
              for row in report["rows"]]
    return "\n".join(lines)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="auto", help="cuda, cpu or auto (cuda when a GPU is visible)")
    p.add_argument("--out", help="write the rows, with each profile's status, rule and feedback, to this JSON file")
    p.add_argument("--render", metavar="JSON", help="print the table of a file --out wrote, and nothing else")
    p.add_argument("--timing-budget-s", type=float, default=2.0,
                   help="evaluate.py's timing budget per candidate: the statuses, not the speedups, are the point")
    p.add_argument("--run-timeout-s", type=float, default=30.0,
                   help="evaluate.py's run timeout per candidate (the hanging ones wait this long, in each profile)")
    args = p.parse_args()
    if args.render:
        print(render(json.loads(Path(args.render).read_text())))
        return

    kind, _ = ev.resolve_device(ev.EvalConfig(device=args.device))
    folders = [Path("solutions") / kind, Path("tests") / "adversarial" / kind]
    tasks = str(ev.ROOT / ("tasks" if kind == "cuda" else "tests/tasks"))
    records = with_tasks_from([{**r, "solution": f"{folder}/{r['solution']}"} for folder in folders
                               for r in library_records(ev.ROOT / folder)],
                              index_tasks(tasks), ev.ROOT / "tests" / "adversarial" / "tasks")
    results = {rules: ev.evaluate(records, ev.EvalConfig(device=kind, tasks=tasks, rules=rules,
                                                         timing_budget_s=args.timing_budget_s,
                                                         run_timeout_s=args.run_timeout_s)) for rules in PROFILES}
    device = "CPU" if kind == "cpu" else torch.cuda.get_device_name(0)
    rows = [{"candidate": record["solution"],
             **{rules: {"verdict": verdict(results[rules][i]), "status": results[rules][i]["status"],
                        "feedback": results[rules][i]["feedback"].replace(f"{ev.ROOT}/", "")} for rules in PROFILES}}
            for i, record in enumerate(records)]
    report = {"device": device, "rows": rows}
    print(render(report))
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
