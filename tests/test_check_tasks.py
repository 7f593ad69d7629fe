"""bench/check_tasks.py: a degenerate task is flagged for each way it is degenerate; the real ones pass."""
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
import check_tasks as ct  # noqa: E402


DEGENERATE_TASK = """
import torch
import torch.nn as nn

class Model(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.w = nn.Parameter(torch.randn(n))

    def forward(self, x):
        return torch.softmax(x.sum(dim=1, keepdim=True), dim=1) * (1 + 0 * self.w)

def get_inputs():
    return [torch.randn(64, 32)]

def get_init_inputs():
    return [32]
"""


def test_the_task_check_flags_a_degenerate_task_and_passes_real_ones(tmp_path):
    (tmp_path / "softmax_of_one.py").write_text(DEGENERATE_TASK)
    assert ct.check_task(tmp_path / "softmax_of_one.py", "cpu") == [
        "nearly constant output", "output does not depend on the inputs", "output does not depend on the parameters"]
    for path in ct.ev.index_tasks(ROOT / "tests" / "tasks").values():
        assert ct.check_task(path, "cpu") == []


def test_the_table_goes_to_stdout_and_the_progress_to_stderr(tmp_path):
    """So `python bench/check_tasks.py tasks > file.md` writes the table to the file."""
    folder = tmp_path / "level1"
    folder.mkdir()
    (folder / "softmax_of_one.py").write_text(DEGENERATE_TASK)
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "check_tasks.py"), str(folder), "--device", "cpu"],
                          capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert done.returncode == 1  # a task is flagged
    assert done.stdout.splitlines() == [
        "| task | flags |", "|---|---|", "| level1/softmax_of_one | nearly constant output; output does not depend on "
        "the inputs; output does not depend on the parameters |", "", "1 of 1 tasks flagged"]
    assert "checking tasks" in done.stderr and "| task |" not in done.stderr
