"""bench/clock_phases.py: the phases it notes add up to the judge's clock of each call, through the real evaluator
on a real candidate, and a copy whose notes no longer apply is refused rather than run unnoted."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
import clock_phases as cp  # noqa: E402


@pytest.mark.slow
def test_each_calls_phases_add_up_to_the_judges_clock_of_it(tmp_path):
    out = tmp_path / "phases.json"
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "clock_phases.py"), "--device", "cpu",
                           "--kernels", "7_ReLU.correct_loop", "--out", str(out)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "| level1/7_ReLU.correct_loop | 0 | correct |" in done.stdout
    [kept] = json.loads(out.read_text())
    calls = kept["calls"]["calls"]
    assert {c["label"].split("/")[0] for c in calls} >= {"null", "candidate"}
    for c in calls:
        assert c["prep"] + c["go"] == pytest.approx(c["judge"], abs=1e-6), c
        assert c["timer"] + c["put"] <= c["go"], c
    assert kept["reported_calls"] >= 10 and set(kept["excess"]) == set(cp.PHASES)


def test_a_copy_whose_notes_no_longer_apply_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(cp, "NOTES", [*cp.NOTES, ("judge.py", "text no judge has", "")])
    with pytest.raises(SystemExit, match="kevin/judge.py has changed"):
        cp.noted_copy(tmp_path)
