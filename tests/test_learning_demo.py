"""bench/learning_demo.py: the runs it launches, how it summarises them, and one whole (junk-policy) run on a CPU."""
import argparse
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
import learning_demo as ld  # noqa: E402


def flag(command: list[str], name: str) -> str:
    return command[command.index(name) + 1]


def test_single_turn_run_writes_as_many_kernels_per_step_as_the_multi_turn_run():
    args = argparse.Namespace(n_trajectories=4, turns=4, tasks="t", tasks_per_step=1, steps=8, lr=1e-4,
                              device="cpu", train_args="--group-by task-turn")
    multi = ld.train_command(args, "multi", 1, "m", 300, Path("o"))
    single = ld.train_command(args, "single", 1, "m", 300, Path("o"))
    assert (flag(multi, "--n-trajectories"), flag(multi, "--turns")) == ("4", "4")
    assert (flag(single, "--n-trajectories"), flag(single, "--turns")) == ("16", "1")
    assert flag(single, "--seed") == flag(multi, "--seed") == "1"
    assert multi[-2:] == single[-2:] == ["--group-by", "task-turn"]
    assert "--overwrite" in multi and "--resume" not in multi  # no checkpoint yet: a leftover log is started over


def metrics_row(step: int, score: float, per_turn: list[float]) -> dict:
    row = {"step": step, "reward/score": score, "reward/correct": score / 2}
    row.update({f"reward/score_turn{t + 1}": s for t, s in enumerate(per_turn)})
    return row


def test_summary_averages_the_first_and_last_window_of_steps():
    metrics = [metrics_row(1, 0.2, [0.1, 0.3]), metrics_row(2, 0.4, [0.3, 0.5]),
               metrics_row(3, 0.6, [0.5, 0.7]), metrics_row(4, 1.0, [0.8, 1.2])]
    summary = ld.summarise(metrics, window=2)
    assert summary["score_start"] == pytest.approx(0.3)
    assert summary["score_end"] == pytest.approx(0.8)
    assert summary["turn_start"] == pytest.approx([0.2, 0.4])
    assert summary["turn_end"] == pytest.approx([0.65, 0.95])
    assert summary["correct_end"] == pytest.approx(0.4)


def test_table_and_plot_show_every_seed_and_the_mean(tmp_path):
    runs = {}
    for seed in (1, 2):
        runs[f"multi_seed{seed}"] = ld.summarise([metrics_row(1, 0.5, [0.2, 0.8]), metrics_row(2, 0.9 + seed / 10,
                                                                                           [0.7, 1.1])], 1)
        runs[f"single_seed{seed}"] = ld.summarise([metrics_row(1, 0.3, [0.3]), metrics_row(2, 0.6, [0.6])], 1)
    text = ld.table(runs, [1, 2])
    lines = text.splitlines()
    assert [line.split("|")[0].strip() for line in lines[2:]] == ["1", "2", "mean"]
    assert "1.050" in lines[-1] and "+0.300" in lines[-1]  # mean multi-turn end, single-turn rise
    ld.plot(runs, [1, 2], tmp_path / "demo.png")
    assert (tmp_path / "demo.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_report_names_paths_in_the_repository_relative_to_it_and_others_not_at_all():
    report = ld.repo_relative({"tasks": str(ld.REPO / "tests" / "tasks"), "out": ["/elsewhere/ld"], "lr": 0.1,
                               "kernel": "level1/7_ReLU.correct_vec4"})
    assert report == {"tasks": "tests/tasks", "out": [None], "lr": 0.1, "kernel": "level1/7_ReLU.correct_vec4"}


@pytest.mark.slow
def test_whole_demo_runs_train_py_twice_and_writes_its_report(tmp_path):
    """With the untrained tiny model every reply is junk (score 0, nothing built); the orchestration is real."""
    from kevin.tiny_model import build_tiny_model

    ld.main(["--device", "cpu", "--warm-model", build_tiny_model(), "--seeds", "1", "--steps", "1", "--turns", "2",
             "--n-trajectories", "1", "--max-tokens", "8", "--window", "1", "--parallel", "2",
             "--out-dir", str(tmp_path)])
    report = json.loads((tmp_path / "learning_demo.json").read_text())
    assert set(report["runs"]) == {"multi_seed1", "single_seed1"}
    assert report["config"]["tasks_per_step"] == 2  # every task of tests/tasks in every step, by default
    assert report["config"]["tasks"] == "tests/tasks" and report["config"]["out_dir"] is None  # tmp_path: elsewhere
    assert len(report["runs"]["multi_seed1"]["turn_end"]) == 2 and len(report["runs"]["single_seed1"]["turn_end"]) == 1
    assert report["runs"]["multi_seed1"]["score_end"] == 0.0
    assert (tmp_path / "learning_demo.png").exists()
