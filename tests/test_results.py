"""results/: the measurements the README quotes name no folder of the machine that made them."""
import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# An absolute path into a home, the root's home, a scratch or work folder: where a run's own machine kept it.
MACHINE_PATH = re.compile(r"(?<![\w./~-])/(?:root|home|Users|tmp|var/tmp|work|scratch|mnt|data|opt)(?:/|\b)")
RESULTS = sorted(p for p in (ROOT / "results").rglob("*") if p.suffix in (".json", ".jsonl"))


def strings(value):
    """Every key and string value in a JSON value, nested ones too."""
    if isinstance(value, dict):
        for k, v in value.items():
            yield k
            yield from strings(v)
    elif isinstance(value, list):
        for v in value:
            yield from strings(v)
    elif isinstance(value, str):
        yield value


def test_the_pattern_finds_a_machine_path_inside_a_sentence_and_not_a_division():
    assert MACHINE_PATH.search("exit 1 after 28 s (log: /work/main/runs/x/launch.log)")
    assert MACHINE_PATH.search("/root/ld") and MACHINE_PATH.search("/home/me/kevin/runs")
    assert not MACHINE_PATH.search("solutions/warm_start/tmp/cuda") and not MACHINE_PATH.search("a / tmp")


@pytest.mark.parametrize("path", RESULTS, ids=lambda p: str(p.relative_to(ROOT / "results")))
def test_a_results_file_holds_no_absolute_path_of_its_machine(path):
    text = path.read_text()
    values = [json.loads(line) for line in text.splitlines() if line.strip()] if path.suffix == ".jsonl" \
        else [json.loads(text)]
    found = [s[:120] for v in values for s in strings(v) if MACHINE_PATH.search(s)]
    assert found == [], found
