"""Where the judge's clock of a timed call goes: its phases, in the calls of no candidate and in the candidate's.

The floor (kevin/judge_checks.py, `judges_floor`) charges a candidate what the judge's own wall clock saw its calls
take beyond their reported time, less what it saw the calls of no candidate take beyond theirs. This script runs
evaluate.evaluate from a copy of kevin/ whose judge and runner also note each call's phases, and prints for each
kernel the median of each phase in the clean calls, and how much longer it was in the candidate's reported calls
(their events taken off where the phase holds the call):

  prep      the judge writes the inputs and clears the output slots (its own GPU copies, and a synchronize)
  go        the request, the runner's timed call, its outputs handed over, and its answer, of which
  timer     the runner's timer from its first synchronize to its last (the events are inside), of which
  beyond    the timer's wall clock less the events: the flush's tail, the launch, the closing synchronize
  put       the runner's copy into the slots and its synchronize
  answer    the rest of go: the request and answer crossing the socket, and the runner's Python around them

    python bench/clock_phases.py --kernels 7_ReLU.correct_vec4,10_Tanh.correct_scalar --reps 3
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PHASES = ("judge", "prep", "go", "timer", "beyond", "put", "answer")
WITH_THE_CALL = {"judge", "go", "timer"}  # phases that hold the model's own GPU time (its events)

# (file, text, what replaces it): each must be found once, or the copy is not made.
NOTES = [
    ("judge.py", '''        answer = self.ask(message, awake=self.awake)
        wall_s = time.perf_counter() - began
''', '''        sent = time.perf_counter()
        answer = self.ask(message, awake=self.awake)
        wall_s = time.perf_counter() - began
        self.phases.append({"label": label, "judge": wall_s * 1e3, "prep": (sent - began) * 1e3,
                            "go": (began + wall_s - sent) * 1e3,
                            **{k: answer.get(k) for k in ("events", "wall", "timer", "put")}})
'''),
    ("judge.py", '''        walls, cpus, unlogged, clean = [], [], [], {"reference": [], "timer": []}
''', '''        self.phases = []
        walls, cpus, unlogged, clean = [], [], [], {"reference": [], "timer": []}
'''),
    ("judge.py", '''"floor_allowance_ms": allowance_ms}''',
     '''"floor_allowance_ms": allowance_ms,
                "phases": {"calls": self.phases, "logged": sorted(self.logged)}}'''),
    ("evaluator.py", '''floor_allowance_ms=outcome.get("floor_allowance_ms"),''',
     '''floor_allowance_ms=outcome.get("floor_allowance_ms"), phases=outcome.get("phases"),'''),
    ("runner.py", '''        events, wall, out = self.timer(model, args, message["label"])
        return {"events": events, "wall": wall, **self.put_outputs(out, held)}''', '''        began = time.perf_counter()
        events, wall, out = self.timer(model, args, message["label"])
        timed = time.perf_counter()
        answer = self.put_outputs(out, held)
        return {"events": events, "wall": wall, **answer, "timer": (timed - began) * 1e3,
                "put": (time.perf_counter() - timed) * 1e3}'''),
]


def noted_copy(folder: Path) -> Path:
    """kevin/ copied into `folder` with NOTES applied."""
    shutil.copytree(ROOT / "kevin", folder / "kevin", ignore=shutil.ignore_patterns("__pycache__"))
    for name, old, new in NOTES:
        path = folder / "kevin" / name
        text = path.read_text()
        if text.count(old) != 1:
            raise SystemExit(f"error: kevin/{name} has changed: update bench/clock_phases.py's NOTES")
        path.write_text(text.replace(old, new))
    return folder


def medians(calls: list[dict]) -> dict:
    """Each phase's median over `calls`, in ms (the timer's beyond its events as `beyond`)."""
    rows = [{**c, "beyond": c["wall"] - c["events"], "answer": c["go"] - c["timer"] - c["put"]} for c in calls]
    return {k: statistics.median(r[k] for r in rows) for k in (*PHASES, "events")} if rows else {}


def phases_of(result: dict) -> dict:
    """The clean calls' medians and the reported calls' excess over them (events off where the phase holds them).
    The reported calls are the unlogged ones on a GPU and all of them on the CPU, as the floor reads them."""
    noted = result.get("phases") or {}
    logged, calls = set(noted.get("logged", [])), noted.get("calls", [])
    unlogged = any(c["label"] not in logged for c in calls if c["label"].startswith("null/"))

    def kind(prefix: str) -> list[dict]:
        return [c for c in calls if c["label"].startswith(prefix) and c.get("events") is not None
                and not c["label"].split("/")[1].startswith("-") and (not unlogged or c["label"] not in logged)]
    candidate_calls = kind("candidate/")
    clean, reported = medians(kind("null/")), medians(candidate_calls)
    if not clean or not reported:
        return {}
    excess = {k: reported[k] - clean[k] - (reported["events"] - clean["events"] if k in WITH_THE_CALL else 0)
              for k in PHASES}
    return {"clean": clean, "excess": excess, "reported_calls": len(candidate_calls)}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--kernels", required=True, help="comma-separated ends of library file names "
                   "(e.g. 7_ReLU.correct_vec4), looked up in solutions/<device> and tests/adversarial/<device>")
    p.add_argument("--device", default="auto", help="cuda, cpu or auto")
    p.add_argument("--reps", type=int, default=1, help="evaluations of each kernel, one after another")
    p.add_argument("--out", help="write every call's phases to this JSON file")
    p.add_argument("--noted", help=argparse.SUPPRESS)  # the copy to run from (this script, run again)
    args = p.parse_args()
    if not args.noted:
        with tempfile.TemporaryDirectory() as folder:
            copy = noted_copy(Path(folder))
            env = {**os.environ, "PYTHONPATH": str(copy)}
            raise SystemExit(subprocess.run([sys.executable, __file__, *sys.argv[1:], "--noted", str(copy)],
                                            env=env).returncode)

    sys.path.insert(0, args.noted)
    from kevin import evaluator as ev
    from kevin.eval_records import library_records, with_tasks_from
    from kevin.tasks import index_tasks

    kind, gpus = ev.resolve_device(ev.EvalConfig(device=args.device))
    task_folder = ROOT / ("tasks" if kind == "cuda" else "tests/tasks")
    tasks, wanted = index_tasks(str(task_folder)), args.kernels.split(",")
    records = []
    for folder in (ROOT / "solutions" / kind, ROOT / "tests" / "adversarial" / kind):
        records += with_tasks_from(library_records(folder), tasks, ROOT / "tests" / "adversarial" / "tasks")
    chosen = [r for r in records if any(r["solution"].endswith(w) for w in wanted)]
    if not chosen:
        raise SystemExit(f"error: no library file ends with any of {wanted}")
    cfg = ev.EvalConfig(device=kind, tasks=str(task_folder), gpus=[int(gpus[0].split(":")[1])] if kind == "cuda"
                        else None, progress=False)
    print("| kernel | rep | status | unreported ms | allowance ms | " + " | ".join(PHASES) + " |")
    print("|---|---|---|---|---|" + "---|" * len(PHASES))
    kept = []
    for rep in range(args.reps):
        for record, result in zip(chosen, ev.evaluate(chosen, cfg)):
            found = phases_of(result)
            cells = " | ".join(f"{found['clean'][k]:.3f} {found['excess'][k] * 1e3:+.0f}µs" for k in PHASES) \
                if found else "no timed calls"
            print(f"| {record['solution']} | {rep} | {result['status']} | {result.get('unreported_ms') or 0:.3f} | "
                  f"{result.get('floor_allowance_ms') or 0:.3f} | {cells} |", flush=True)
            kept.append({"kernel": record["solution"], "rep": rep, "status": result["status"], **found,
                         "unreported_ms": result.get("unreported_ms"), "calls": result.get("phases")})
    print("Each phase: its median in the clean calls (ms), then how much longer in the candidate's reported calls.")
    if args.out:
        Path(args.out).write_text(json.dumps(kept, indent=1))


if __name__ == "__main__":
    main()
