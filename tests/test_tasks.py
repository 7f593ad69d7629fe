"""The task set under tasks/: every file follows the KernelBench format, runs, and is named by split.json.

Forward passes run on the `meta` device: shapes and dtypes are checked without computing or allocating,
so the whole file stays fast on a CPU. Real timings and memory come from bench/task_times.py on a GPU.
"""
import importlib.util
import json
from pathlib import Path
from types import ModuleType

import pytest
import torch

TASKS_DIR = Path(__file__).resolve().parents[1] / "tasks"
TASK_FILES = sorted(TASKS_DIR.glob("*/*.py"), key=lambda p: (p.parent.name, int(p.stem.split("_")[0]), p.stem))
MEMORY_LIMIT_BYTES = 4e9


def task_id(path: Path) -> str:
    return f"{path.parent.name}/{path.stem}"


def load_task(path: Path) -> ModuleType:
    """Import a task file by path; the name is made unique so tasks never shadow each other."""
    spec = importlib.util.spec_from_file_location(f"task_{path.parent.name}_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def tensor_bytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors if isinstance(t, torch.Tensor))


def test_task_set_has_at_least_40_tasks_across_both_levels():
    levels = {path.parent.name for path in TASK_FILES}
    assert len(TASK_FILES) >= 40
    assert levels == {"level1", "level2"}


@pytest.mark.parametrize("path", TASK_FILES, ids=task_id)
def test_task_file_defines_model_inputs_and_a_short_docstring(path: Path):
    module = load_task(path)
    assert isinstance(module.Model, type) and issubclass(module.Model, torch.nn.Module)
    assert callable(module.get_inputs) and callable(module.get_init_inputs)
    assert isinstance(module.get_init_inputs(), list)
    docstring = (module.__doc__ or "").strip()
    assert docstring, "a task opens with a docstring"
    assert len(docstring.splitlines()) <= 4


@pytest.mark.parametrize("path", TASK_FILES, ids=task_id)
def test_task_forward_runs_on_meta_and_fits_in_4gb(path: Path):
    module = load_task(path)
    with torch.device("meta"):
        model = module.Model(*module.get_init_inputs())
        inputs = module.get_inputs()
    assert isinstance(inputs, list) and inputs
    inputs = [x.to("meta") if isinstance(x, torch.Tensor) else x for x in inputs]
    with torch.no_grad():
        output = model(*inputs)
    assert isinstance(output, torch.Tensor)
    assert output.is_meta and output.numel() > 1
    state = list(model.parameters()) + list(model.buffers())
    bound = tensor_bytes(inputs) + tensor_bytes(state) + output.numel() * output.element_size()
    print(f"{task_id(path)}: inputs + parameters + output = {bound / 1e9:.2f} GB")
    assert bound < MEMORY_LIMIT_BYTES, f"{task_id(path)} needs {bound / 1e9:.2f} GB"


def test_split_names_every_task_file_exactly_once():
    split = json.loads((TASKS_DIR / "split.json").read_text())
    assert set(split) == {"train", "heldout"}
    train, heldout = split["train"], split["heldout"]
    assert len(train) == len(set(train)) and len(heldout) == len(set(heldout))
    assert not set(train) & set(heldout)
    assert set(train) | set(heldout) == {task_id(path) for path in TASK_FILES}


def test_heldout_is_about_a_fifth_and_mixes_both_levels():
    split = json.loads((TASKS_DIR / "split.json").read_text())
    share = len(split["heldout"]) / (len(split["train"]) + len(split["heldout"]))
    assert 0.1 <= share <= 0.3
    assert {task.split("/")[0] for task in split["heldout"]} == {"level1", "level2"}
