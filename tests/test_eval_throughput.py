"""bench/eval_throughput.py: its baseline must be a fair one, so its numbers mean something."""
import pytest
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
import eval_throughput as et  # noqa: E402

ev = et.ev


@pytest.mark.slow
def test_the_baseline_checks_a_candidate_built_twice_under_one_name_without_building_it_again(tmp_path):
    """A GRPO group repeats candidates word for word; the baseline builds each copy in its own folder, as a
    build cache keyed by candidate does, and must then load each copy as built, not rebuild it renamed."""
    record = next(r for r in ev.library_records(ROOT / "solutions" / "cpu") if ".correct_" in r["solution"])
    run = et.run_baseline([record, record], ev.index_tasks(str(ROOT / "tests" / "tasks")), "cpu", tmp_path, cores=2)
    assert [r["status"] for r in run["results"]] == ["correct", "correct"]
    assert len(run["build_s"]) == 2
    assert len(list(tmp_path.rglob("*.so"))) == 2
    assert not list(tmp_path.rglob("*_v1*")), "a copy was built again, renamed, while checking"
