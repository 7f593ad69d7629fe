"""bench/rollout_overlap.py: the two train.py runs it launches and the table it makes of their logs."""
import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
import rollout_overlap as ro  # noqa: E402


def test_the_two_runs_differ_in_overlap_only():
    args = argparse.Namespace(tasks="t", tasks_per_step=2, n_trajectories=4, turns=4, steps=3, max_tokens=300,
                              device="cpu", seed=0, train_args="--lr 1e-4")
    sync, overlapped = (ro.train_command(args, "m", overlap, Path("o")) for overlap in (False, True))
    assert overlapped == sync[:-2] + ["--overlap"] + sync[-2:] and sync[-2:] == ["--lr", "1e-4"]


def logged(rollout: float, generate: float, build: float, check: float, update: float) -> dict:
    return {"time/rollout_s": rollout, "time/generate_s": generate, "time/build_s": build, "time/check_s": check,
            "time/update_s": update, "time/push_s": 0.0}


def test_the_table_takes_medians_past_the_first_step_and_shows_how_far_the_phases_overlapped():
    first = logged(100.0, 10.0, 80.0, 10.0, 1.0)  # the first step builds what the cache lacks: left out
    sync = ro.medians(ro.step_seconds([first, logged(20.0, 10.0, 4.0, 6.0, 1.0), logged(22.0, 10.0, 5.0, 7.0, 1.0)]))
    overlapped = ro.medians(ro.step_seconds([first, logged(12.0, 10.0, 4.0, 6.0, 1.0)]))
    assert sync["rollout"] == 21.0 and sync["step"] == 22.0 and overlapped["step"] == 13.0
    lines = ro.table(sync, overlapped).splitlines()
    assert "| rollout (wall) | 21.00 | 12.00 | 1.75x |" in lines and "| step (wall) | 22.00 | 13.00 | 1.69x |" in lines
    assert lines[-1] == "| rollout phases / rollout wall | 1.00x | 1.67x | |"
    assert "| weight push | 0.00 | 0.00 | - |" in lines
