"""The README's pipeline on a CPU runs as written: its commands, in order, on a fresh copy of the repository.

A copy, because the scripts write their outputs and caches (runs/, .cache/) beside themselves; it starts without
them, as a fresh clone does."""
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
HEADING = "## The pipeline on a CPU, step by step"


def pipeline_commands(readme: str) -> list[str]:
    """The lines of the bash block under HEADING, a line continued with a backslash joined to the next."""
    found = re.search(re.escape(HEADING) + r"\n+```bash\n(.*?)```", readme, re.S)
    assert found, f"no bash block under {HEADING!r} in README.md"
    return [line.strip() for line in found.group(1).replace("\\\n", " ").splitlines() if line.strip()]


@pytest.mark.slow
def test_the_readmes_cpu_pipeline_runs_in_order_on_a_fresh_copy(tmp_path):
    repo = tmp_path / "kevin"
    shutil.copytree(ROOT, repo, ignore=shutil.ignore_patterns(".*", "runs", "__pycache__"))
    commands = pipeline_commands((ROOT / "README.md").read_text())
    assert [c.split()[1] for c in commands] == ["generate.py", "reward.py", "train.py", "scale_test.py"]
    for i, command in enumerate(commands):
        done = subprocess.run(["bash", "-o", "pipefail", "-c", command], cwd=repo, capture_output=True, text=True,
                              timeout=600)
        assert done.returncode == 0, f"{command}\n{done.stderr[-3000:]}"
        for path in re.findall(r"runs/[\w./-]+", " ".join(commands[:i + 1])):  # its outputs: what later ones read
            assert (repo / path).exists(), f"{command} made no {path}"
    scale = json.loads((repo / re.search(r"--out-json (\S+)", commands[-1]).group(1)).read_text())
    assert [(a["trajectories"], a["turns"]) for a in scale["allocations"] if "skipped" not in a] == [(1, 2), (2, 1)]
