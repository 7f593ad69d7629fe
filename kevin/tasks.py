"""Tasks: KernelBench-format files (a `Model`, `get_inputs`, `get_init_inputs`), found in a file, a folder or a
KernelBench level folder, unchanged, or named by a split of tasks/split.json."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SPLITS = REPO / "tasks" / "split.json"


def index_tasks(path: str | Path) -> dict[str, Path]:
    """Task id -> file for a task file, a folder of them, or a KernelBench level folder, unchanged.

    Ids are `<parent folder>/<file stem>` (e.g. `level1/19_ReLU`), stable wherever the folder lives."""
    path = Path(path)
    if path.is_file():
        files = [path]
    elif path.is_dir():
        files = sorted(p for p in path.rglob("*.py") if not p.name.startswith(("_", ".")))
    else:
        raise SystemExit(f"error: no task file or folder at {path}")
    tasks = {}
    for f in files:
        text = f.read_text(errors="replace")
        if "class Model" in text and "def get_inputs" in text:
            tasks[f"{f.parent.name}/{f.stem}"] = f.resolve()
    return tasks


def resolve_task(task: str, index: dict[str, Path]) -> Path:
    if task in index:
        return index[task]
    if Path(task).is_file():
        return Path(task).resolve()
    raise ValueError(f"unknown task {task!r}: neither a task id under the task folder nor a file")


@dataclass
class Task:
    id: str  # "<parent folder>/<file stem>"
    path: Path
    source: str


def load_tasks(tasks: str, split: str | None) -> list[Task]:
    """Tasks from a file or folder, or a split name of tasks/split.json; --split keeps only that split."""
    splits = json.loads(SPLITS.read_text()) if SPLITS.exists() else {}
    if not Path(tasks).exists():
        if tasks not in splits:
            raise SystemExit(f"error: --tasks {tasks}: not a task file, a folder or a split "
                             f"({', '.join(splits) or 'none'})")
        tasks, split = str(REPO / "tasks"), split or tasks
    index = index_tasks(tasks)
    if split:
        if split not in splits:
            raise SystemExit(f"error: --split {split}: {SPLITS} has only {', '.join(splits) or 'no splits'}")
        missing = [task_id for task_id in splits[split] if task_id not in index]
        if missing:
            raise SystemExit(f"error: --split {split}: {len(missing)} tasks not found in {tasks}, e.g. {missing[0]}")
        index = {task_id: index[task_id] for task_id in splits[split]}
    if not index:
        raise SystemExit(f"error: --tasks {tasks}: no task files (a Model class and get_inputs) found")
    return [Task(task_id, path, path.read_text()) for task_id, path in index.items()]
