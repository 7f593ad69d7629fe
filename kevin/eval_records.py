"""The evaluator's JSONL: its input records (a file, stdin, or the hand-written library in solutions/), and the
output that a resumed run goes on from. Every problem with either is a one-line error naming the line.
"""
from __future__ import annotations

import fcntl
import json
import sys
from pathlib import Path


def library_records(folder: str | Path) -> list[dict]:
    """Hand-written candidates, one record per file, such as those in solutions/cuda/ and solutions/cpu/.

    Files are `<level>/<task stem>.<expected status>_<what>.py`, so such a library checks itself: each
    file's name says what the evaluator must answer (for a rejection, `what` is the rule's name)."""
    files = sorted(Path(folder).rglob("*.py"))
    return [{"task": f"{f.parent.name}/{f.name.split('.')[0]}", "code": f.read_text(),
             "solution": f"{f.parent.name}/{f.name.removesuffix('.py')}"} for f in files]


def with_tasks_from(records: list[dict], index: dict, folder: str | Path) -> list[dict]:
    """`records`, each whose task `index` lacks naming it by its file in `folder`: tests/adversarial/tasks
    holds a transpose, which no task set of the project has."""
    return [r if r["task"] in index else {**r, "task": str(Path(folder) / f"{r['task']}.py")} for r in records]


def read_records(source: str) -> list[dict]:
    """JSONL records from a file or stdin, each checked for `task` and `code`; one-line errors."""
    try:
        text = sys.stdin.read() if source == "-" else Path(source).read_text()
    except OSError as e:
        raise SystemExit(f"error: cannot read {source}: {e.strerror}")
    records = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            raise SystemExit(f"error: {source}:{number}: not valid JSON ({e.msg})")
        if not isinstance(record, dict) or "task" not in record or "code" not in record:
            raise SystemExit(f"error: {source}:{number}: a record needs the fields `task` and `code`")
        records.append(record)
    return records


def open_output(output: str):
    """OUT opened to append, and locked (advisory, until this run closes it or ends): a second run on the same
    file would write every result again, and a resume after both would take the copies for another input's."""
    try:
        out = open(output, "a")
    except OSError as e:
        raise SystemExit(f"error: cannot write {output}: {e.strerror}") from None
    try:
        fcntl.flock(out, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        out.close()
        raise SystemExit(f"error: {output} is being written by another run; wait for it to end, then run again "
                         "to resume") from None
    return out


def already_written(output: str, records: list[dict]) -> int:
    """How many results OUT holds for these records. Line i must be record i with its `eval` added: an OUT
    written from another input, or one with a blank or garbled line, is a one-line error, never resumed. OUT
    exists: open_output has made it."""
    lines = Path(output).read_text().splitlines()
    for number, line in enumerate(lines, 1):
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            raise SystemExit(f"error: {output}:{number}: {'a blank line' if not line.strip() else 'not valid JSON'}"
                             ", not a result; mend or remove it to resume") from None
        if not isinstance(row, dict) or "eval" not in row:
            raise SystemExit(f"error: {output}:{number}: not a result (no `eval`); mend or remove it to resume")
        inputs = {k: v for k, v in row.items() if k != "eval"}
        if number > len(records) or inputs != {k: v for k, v in records[number - 1].items() if k != "eval"}:
            raise SystemExit(f"error: {output}:{number}: the result of another input than record {number} of this "
                             "one; give a new -o file")
    return len(lines)
