"""The documented commands run as written, in order, on a fresh copy of the repository: every line of the README's
bash blocks after the first (the set-up commands, which `.ci/run` runs), then of docs/usage.md's, which continue
them, but those tagged with what a CPU machine lacks (a GPU, a real model, a server, a KernelBench checkout) or
[long]. Each line reads only what an earlier line wrote.

A copy, because the scripts write their outputs and caches (runs/, .cache/) beside themselves; it starts without
them, as a fresh clone does."""
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TAGS = ("GPU", "model", "server", "KernelBench", "long")
TAGGED = re.compile(r"#.*\[(" + "|".join(TAGS) + r")\]")


DOCUMENTS = ("README.md", "docs/usage.md")  # in this order: usage.md's blocks read what the README's wrote


def bash_blocks(document: str) -> list[str]:
    return re.findall(r"```bash\n(.*?)```", (ROOT / document).read_text(), re.S)


def readme_lines() -> list[str]:
    """Every line of the README's bash blocks after the first, then of usage.md's, a line continued with a backslash
    joined to the next."""
    readme, usage = (bash_blocks(document) for document in DOCUMENTS)
    assert len(readme) > 1, "README.md has no bash blocks beyond the set-up commands"
    assert usage, "docs/usage.md has no bash blocks"
    return [" ".join(line.split()) for block in readme[1:] + usage for line in block.replace("\\\n", " ").splitlines()
            if line.strip()]


def test_every_readme_line_is_run_here_or_tagged_with_what_it_needs():
    """A tag names one of TAGS, in brackets, in the line's comment; any other bracketed word in a comment is a typo
    that would leave a line untested without saying why."""
    lines = readme_lines()
    for line in lines:
        comment = line.partition(" # ")[2]
        unknown = set(re.findall(r"\[(\w+)\]", comment)) - set(TAGS)
        assert not unknown, f"unknown tag {unknown} in: {line}"
    runnable = [line for line in lines if not TAGGED.search(line)]
    assert len(runnable) >= 12 and len(runnable) < len(lines)


@pytest.mark.slow
def test_the_readmes_lines_run_in_order_on_a_fresh_copy(tmp_path):
    repo = tmp_path / "kevin"
    shutil.copytree(ROOT, repo, ignore=shutil.ignore_patterns(".*", "runs", "__pycache__"))
    commands = [line for line in readme_lines() if not TAGGED.search(line)]
    for i, command in enumerate(commands):
        done = subprocess.run(["bash", "-o", "pipefail", "-c", command], cwd=repo, capture_output=True, text=True,
                              timeout=900)
        assert done.returncode == 0, f"{command}\n{done.stderr[-3000:]}"
        for path in re.findall(r"runs/[\w./-]+\w", command.partition(" # ")[0]):  # what it wrote or read
            assert (repo / path).exists(), f"{command} left no {path}"
    scale = json.loads((repo / "runs/pipeline/scale.json").read_text())
    assert [(a["trajectories"], a["turns"]) for a in scale["allocations"] if "skipped" not in a] == [(1, 2), (2, 1)]
    solutions = [json.loads(line) for line in (repo / "runs/solutions.jsonl").read_text().splitlines()]
    assert all(r["solution"].split(".")[-1].startswith(r["eval"]["status"]) for r in solutions)
    again = [json.loads(line) for line in (repo / "runs/again.jsonl").read_text().splitlines()]
    assert again and all(r["eval"]["status"] == "correct" for r in again)
