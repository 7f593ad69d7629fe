"""bench/timing_fidelity.py: its clean measurement times the models as a bare process would, and its table says
which side a bias is on."""
import pytest
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
import timing_fidelity as tf  # noqa: E402


@pytest.mark.slow
def test_the_clean_measurement_times_both_models_on_the_library_the_evaluator_built(tmp_path):
    """The clean process loads the extension the evaluator built (the same binary) and builds nothing: with the
    evaluator's folder it times both models; with an empty one it says which library is missing."""
    from kevin import evaluator as ev

    solution = ROOT / "solutions" / "cpu" / "level1" / "7_ReLU.correct_loop.py"
    record = {"task": "level1/7_ReLU", "code": solution.read_text(),
              "task_path": str(ROOT / "tests" / "tasks" / "level1" / "7_ReLU.py")}
    builds = tmp_path / "builds"
    cfg = ev.EvalConfig(device="cpu", tasks=str(ROOT / "tests" / "tasks"), build_dir=str(builds), progress=False)
    assert ev.evaluate([record], cfg)[0]["status"] == "correct"
    built = sorted(builds.rglob("*"))

    times = tf.clean(record, "cpu", 5, 1, str(builds), "")
    assert set(times) == {"reference", "candidate"}, times
    assert all(0 < ms < 1000 for ms in times.values()), times
    assert sorted(builds.rglob("*")) == built  # nothing built or written there

    (tmp_path / "empty").mkdir()
    missing = tf.clean(record, "cpu", 5, 1, str(tmp_path / "empty"), "")
    assert "the evaluator built no" in missing["error"] and ".so" in missing["error"], missing


def test_the_table_gives_each_ratio_and_the_worst(capsys):
    """Beside evaluate's ratios, the second clean process's: how far apart two clean measurements are."""
    rows = [{"kernel": "level1/7_ReLU.correct_loop", "clean": {"speedup": 2.0}, "again": {"speedup": 2.1, "ratio": 1.05},
             "alone": {"status": "correct", "ratio": 0.9, "candidate_ratio": 1.1, "reference_ratio": 1.0},
             "batch": {"status": "correct", "ratio": 0.8}},
            {"kernel": "level1/9_Swish.correct_fused", "clean": {"error": "ImportError: x"},
             "again": {"error": "ImportError: x"}, "alone": {"status": "compile_error"}, "batch": {"status": "compile_error"}}]
    tf.report(rows)
    out = capsys.readouterr().out.splitlines()
    assert out[2] == "| level1/7_ReLU.correct_loop | 2.000 | 1.050 | 0.900 | 0.800 | 1.100 | 1.000 |"
    assert out[3] == "| level1/9_Swish.correct_fused | ImportError: x | - | compile_error | compile_error | " \
                     "compile_error | compile_error |"
    assert out[4] == "again: median ratio 1.050, worst 1.050, within 3%: 0/1"
    assert out[5] == "alone: median ratio 0.900, worst 0.900, within 3%: 0/1"


def test_the_report_gives_the_floors_distribution_and_names_the_kernels_it_charged(capsys):
    """Beside the ratios: how far beyond its events the judge saw each honest kernel's calls, the allowance each
    was given, and which of them were charged for it (seen beyond the allowance)."""
    rows = [{"kernel": name, "clean": {"speedup": 1.0}, "again": {}, "batch": {},
             "alone": {"status": "correct", "ratio": 1.0, "unreported_ms": seen, "floor_allowance_ms": allowed}}
            for name, seen, allowed in (("a", 0.004, 0.012), ("b", 0.030, 0.015), ("c", -0.002, 0.011))]
    tf.report(rows)
    out = capsys.readouterr().out.splitlines()
    assert "alone: the judge's clock beyond the events, µs: min -2.0, median 4.0, 90% 30.0, max 30.0" in out
    assert "alone: the floor's allowance, µs: min 11.0, median 12.0, 90% 15.0, max 15.0" in out
    assert "alone: charged beyond its events: 1 (b)" in out
    assert "batch: charged beyond its events: 0 (none)" in out
