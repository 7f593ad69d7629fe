"""scale_test.py: the unbiased estimators, the paper's metrics, beam search and the offline command line."""

import itertools
import json
import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from kevin import config_flags
from scale_test import (ScaleTestConfig, _parser, allocations, beam_search, best_at_k, offline_report, group_pools,
                        pass_at_k, pool_metrics, task_metrics, trajectory_outcome)

ROOT = Path(__file__).resolve().parent.parent


def ev(speedup: float | None) -> dict:
    """An eval dict: a number means a correct kernel with that speedup, None an incorrect one."""
    return {"status": "incorrect" if speedup is None else "correct", "correct": speedup is not None, "speedup": speedup}


def trajectory(task: str, index: int, *speedups: float | None) -> dict:
    return {"task": task, "trajectory": index, "turns": [{"turn": t, "eval": ev(s)} for t, s in enumerate(speedups)]}


def mean_over_subsets(values: list, k: int, statistic) -> float:
    subsets = list(itertools.combinations(values, k))
    return sum(statistic(s) for s in subsets) / len(subsets)


# ---------------------------------------------------------------- estimators against brute force
@pytest.mark.parametrize("n", [1, 2, 3, 5, 8])
def test_best_at_k_equals_the_mean_max_over_all_k_subsets(n):
    rng = random.Random(n)
    values = [rng.choice([0.0, 0.0, 0.5, 1.0, 1.7, 3.2]) for _ in range(n)]  # ties on purpose
    for k in range(1, n + 1):
        assert best_at_k(values, k) == pytest.approx(mean_over_subsets(values, k, max))


@pytest.mark.parametrize("n", [1, 4, 7, 10])
def test_pass_at_k_equals_the_share_of_k_subsets_holding_a_success(n):
    for c in range(n + 1):
        flags = [1] * c + [0] * (n - c)
        for k in range(1, n + 1):
            assert pass_at_k(n, c, k) == pytest.approx(mean_over_subsets(flags, k, max))


@pytest.mark.parametrize("n", [3, 6, 9])
def test_every_task_metric_equals_brute_force_over_k_subsets(n):
    rng = random.Random(100 + n)
    outcomes = [(True, rng.choice([0.4, 1.0, 1.2, 2.0])) if rng.random() < 0.6 else (False, 0.0) for _ in range(n)]
    for k in range(1, n + 1):
        metrics = task_metrics(outcomes, k, [1.0, 1.5])
        assert metrics["correct_best"] == pytest.approx(mean_over_subsets(outcomes, k, lambda s: any(c for c, _ in s)))
        assert metrics["speedup_best"] == pytest.approx(mean_over_subsets(outcomes, k, lambda s: max(x for _, x in s)))
        assert metrics["correct_avg"] == pytest.approx(mean_over_subsets(outcomes, k, lambda s: sum(c for c, _ in s) / k))
        assert metrics["speedup_avg"] == pytest.approx(mean_over_subsets(outcomes, k, lambda s: sum(x for _, x in s) / k))
        for p in (1.0, 1.5):
            fast = mean_over_subsets(outcomes, k, lambda s: any(c and x >= p for c, x in s))
            assert metrics[f"fast_{p}"] == pytest.approx(fast)


def test_best_at_k_stays_finite_for_large_pools():
    # the max of k draws without replacement from 1..N has mean k (N + 1) / (k + 1); values here are 0..N-1
    assert best_at_k([float(i) for i in range(1000)], 500) == pytest.approx(500 * 1001 / 501 - 1)


def test_best_at_k_refuses_k_larger_than_the_pool():
    with pytest.raises(ValueError):
        best_at_k([1.0, 2.0], 3)


# ---------------------------------------------------------------- metrics on hand-made trajectories
def test_a_trajectory_is_correct_if_any_kernel_is_and_keeps_its_best_correct_speedup():
    evals = [ev(None), ev(0.8), ev(1.6), ev(None), ev(1.2)]
    assert [trajectory_outcome(evals, t) for t in range(1, 6)] == [
        (False, 0.0), (True, 0.8), (True, 1.6), (True, 1.6), (True, 1.6)]


def test_task_metrics_match_hand_computation():
    outcomes = [(True, 2.0), (True, 0.5), (False, 0.0), (False, 0.0)]
    metrics = task_metrics(outcomes, k=2, thresholds=[0.5, 1.0, 1.5])
    # 6 pairs; pairs with no correct trajectory: 1; sorted speedups [0, 0, 0.5, 2] weigh 0, 1/6, 2/6, 3/6
    assert metrics == pytest.approx({
        "correct_best": 5 / 6, "correct_avg": 0.5, "speedup_best": 0.5 * 2 / 6 + 2.0 * 3 / 6, "speedup_avg": 0.625,
        "fast_0.5": 5 / 6, "fast_1.0": 0.5, "fast_1.5": 0.5})


def test_with_k_one_best_equals_avg():
    outcomes = [(True, 2.0), (False, 0.0), (True, 0.7)]
    metrics = task_metrics(outcomes, k=1, thresholds=[1.0])
    assert metrics["correct_best"] == pytest.approx(metrics["correct_avg"])
    assert metrics["speedup_best"] == pytest.approx(metrics["speedup_avg"])
    assert metrics["fast_1.0"] == pytest.approx(1 / 3)


# Two tasks, four trajectories of two turns each (hand-computed below).
POOL = [
    trajectory("A", 0, None, 2.0), trajectory("A", 1, 0.5, 1.0), trajectory("A", 2, None, None), trajectory("A", 3, 1.5, None),
    trajectory("B", 0, 1.0, None), trajectory("B", 1, None, None), trajectory("B", 2, None, None), trajectory("B", 3, None, None),
]
# 2 x 2 (k = 2, both turns): A outcomes (T,2.0) (T,1.0) (F,0) (T,1.5); B (T,1.0) and three failures.
TWO_BY_TWO = {"correct_best": (1 + 0.5) / 2, "correct_avg": (0.75 + 0.25) / 2,
              "speedup_best": (10 / 6 + 0.5) / 2, "speedup_avg": (1.125 + 0.25) / 2,
              "fast_1.0": (1 + 0.5) / 2, "fast_1.5": (5 / 6 + 0) / 2}
# 4 x 1 (k = 4 = the pool, first turn only): A (F) (T,0.5) (F) (T,1.5); B (T,1.0) and three failures.
FOUR_BY_ONE = {"correct_best": 1.0, "correct_avg": (0.5 + 0.25) / 2, "speedup_best": (1.5 + 1.0) / 2,
               "speedup_avg": (0.5 + 0.25) / 2, "fast_1.0": 1.0, "fast_1.5": 0.5}


def test_pool_metrics_average_hand_computed_task_metrics():
    mean, per_task = pool_metrics(group_pools(POOL), turns=2, k=2, thresholds=[1.0, 1.5])
    assert mean == pytest.approx(TWO_BY_TWO)
    assert per_task["A"]["speedup_best"] == pytest.approx(10 / 6)
    assert per_task["B"]["fast_1.5"] == 0.0


def test_allocations_spend_the_budget_as_the_paper_does():
    assert allocations(128, [8, 4, 1]) == [(16, 8), (32, 4), (128, 1)]
    assert allocations(16, [8, 4, 1]) == [(2, 8), (4, 4), (16, 1)]
    with pytest.raises(ValueError, match="divisible"):
        ScaleTestConfig(budget=10, turns=[4])


def test_offline_report_skips_allocations_the_pool_cannot_estimate():
    report = offline_report(group_pools(POOL), budget=8, turn_counts=[2, 1], thresholds=[1.0, 1.5],
                            curve_k=None, curve_turns=None)
    four_by_two, eight_by_one = report["allocations"]
    assert (four_by_two["trajectories"], four_by_two["turns"], four_by_two["k"]) == (4, 2, 4)
    assert four_by_two["metrics"]["speedup_best"] == pytest.approx((2.0 + 1.0) / 2)
    assert eight_by_one["skipped"] == "needs 8 trajectories per task, the smallest pool has 4"
    assert "metrics" not in eight_by_one


def test_curves_run_over_every_turn_and_every_k():
    report = offline_report(group_pools(POOL), budget=4, turn_counts=[2, 1], thresholds=[1.0, 1.5],
                            curve_k=2, curve_turns=1)
    vs_turns, vs_k = report["curves"]["vs_turns"], report["curves"]["vs_k"]
    assert (vs_turns["k"], [p["turns"] for p in vs_turns["points"]]) == (2, [1, 2])
    assert {k: pytest.approx(v) for k, v in vs_turns["points"][1].items() if k != "turns"} == TWO_BY_TWO
    assert (vs_k["turns"], [p["k"] for p in vs_k["points"]]) == (1, [1, 2, 3, 4])
    assert {k: pytest.approx(v) for k, v in vs_k["points"][3].items() if k != "k"} == FOUR_BY_ONE


# ---------------------------------------------------------------- beam search
# Speedup each beam position gets at each turn (None: incorrect).
BEAM_SPEEDUPS = [[0.5, 2.0, None, 1.0], [None, 1.2, 3.0, None], [0.1, 0.2, 0.3, 4.0]]


def deterministic_step(states: list[dict]) -> list[dict]:
    """Appends, in place, one turn per beam; "path" records which position each turn was made at."""
    for position, state in enumerate(states):
        turn = len(state["turns"])
        state["turns"].append({"turn": turn, "eval": ev(BEAM_SPEEDUPS[turn][position])})
        state["path"].append(position)
    return states


def test_beam_search_keeps_the_fastest_and_copies_them():
    final = beam_search([{"turns": [], "path": []} for _ in range(4)], deterministic_step, turns=3, keep=2)
    # turn 0 bests [0.5, 2, 0, 1] -> keep positions 1, 3; turn 1 bests [2, 2, 3, 1] -> keep [3, 2], then the
    # earlier of the tied [1, 0] and [1, 1]; turn 2 is the last, so nothing is pruned.
    assert [s["path"] for s in final] == [[3, 2, 0], [3, 2, 1], [1, 0, 2], [1, 0, 3]]
    assert [[t["eval"]["speedup"] for t in s["turns"]] for s in final] == [
        [1.0, 3.0, 0.1], [1.0, 3.0, 0.2], [2.0, None, 0.3], [2.0, None, 4.0]]


def test_beam_search_refuses_a_keep_that_does_not_divide_the_width():
    with pytest.raises(ValueError, match="divide"):
        beam_search([{}] * 4, deterministic_step, turns=2, keep=3)


# ---------------------------------------------------------------- command line
def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "scale_test.py"), *args], capture_output=True, text=True,
                          cwd=ROOT, timeout=120)


def test_offline_cli_writes_the_table_the_json_and_png_curves(tmp_path):
    pytest.importorskip("matplotlib")
    first, second = tmp_path / "a.jsonl", tmp_path / "b.jsonl"  # a task's pool may span files
    first.write_text("".join(json.dumps(t) + "\n" for t in POOL[:6]))
    second.write_text("".join(json.dumps(t) + "\n" for t in POOL[6:]))
    out, plot_dir = tmp_path / "scale.json", tmp_path / "plots"
    result = run_cli(str(first), str(second), "--budget", "4", "--turns", "2,1",
                     "--out", str(out), "--plot-dir", str(plot_dir))
    assert result.returncode == 0, result.stderr
    assert "| independent | 2 x 2 | 4 | 75.0% | 50.0% | 1.08x | 0.69x | 75.0% | 41.7% |" in result.stdout
    assert "| independent | 4 x 1 | 4 | 100.0% | 37.5% | 1.25x | 0.38x | 100.0% | 50.0% |" in result.stdout
    report = json.loads(out.read_text())
    assert report["tasks"] == 2
    assert report["allocations"][0]["metrics"] == pytest.approx(TWO_BY_TWO)
    assert report["allocations"][1]["metrics"] == pytest.approx(FOUR_BY_ONE)
    for name in ("vs_turns.png", "vs_k.png"):
        assert (plot_dir / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


TINY_TASK = """import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        return torch.relu(x)


def get_inputs():
    return [torch.randn(64)]


def get_init_inputs():
    return []
"""


@pytest.mark.slow
def test_live_mode_generates_each_allocation_and_measures_it(tmp_path):
    pytest.importorskip("transformers")
    task = tmp_path / "tasks" / "level0" / "relu.py"
    task.parent.mkdir(parents=True)
    task.write_text(TINY_TASK)
    out = tmp_path / "scale.json"
    result = run_cli("--live", "--budget", "4", "--turns", "2,1", "--beam-width", "2", "--beam-keep", "1",
                     "--out-dir", str(tmp_path / "runs"), "--out", str(out),
                     f"--generate-args=--tasks {task} --device cpu --max-tokens 8")
    assert result.returncode == 0, result.stderr
    shapes = {name: [len(json.loads(line)["turns"]) for line in (tmp_path / "runs" / name).read_text().splitlines()]
              for name in ("2x2.jsonl", "4x1.jsonl")}
    assert shapes == {"2x2.jsonl": [2, 2], "4x1.jsonl": [1, 1, 1, 1]}
    report = json.loads(out.read_text())
    assert [(r["strategy"], r["trajectories"], r["turns"]) for r in report["allocations"]] == [
        ("independent", 2, 2), ("independent", 4, 1), ("beam", 2, 2)]
    # 2 beams x 2 turns keeping 1: after turn 1 the better beam is copied, so both share their first turn
    beams = [json.loads(line) for line in (tmp_path / "runs" / "beam_2x2_keep1.jsonl").read_text().splitlines()]
    assert [(b["trajectory"], len(b["turns"])) for b in beams] == [(0, 2), (1, 2)]
    assert beams[0]["turns"][0] == beams[1]["turns"][0]
    assert "metrics" in report["allocations"][2]
    assert set(report["allocations"][0]["per_task"]) == {"level0/relu"}
    assert report["curves"]["vs_turns"]["k"] == 2 and len(report["curves"]["vs_turns"]["points"]) == 2
    assert "| independent | 4 x 1 | 4 |" in result.stdout and "| beam | 2 x 2 | 4 |" in result.stdout


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason="checks a machine without a GPU")
def test_live_beam_without_a_gpu_asks_for_cpp_and_evaluates_on_the_cpu_by_default(tmp_path):
    """generate.py's --device auto, resolved before the beam's prompts are written."""
    pytest.importorskip("transformers")
    task = tmp_path / "tasks" / "level0" / "relu.py"
    task.parent.mkdir(parents=True)
    task.write_text(TINY_TASK)
    result = run_cli("--live", "--budget", "2", "--turns", "1", "--beam-width", "2", "--beam-keep", "1",
                     "--out-dir", str(tmp_path / "runs"), f"--generate-args=--tasks {task} --max-tokens 4")
    assert result.returncode == 0, result.stderr[-3000:]
    beams = [json.loads(line) for line in (tmp_path / "runs" / "beam_2x1_keep1.jsonl").read_text().splitlines()]
    assert beams and all("cpp_sources` only" in b["turns"][0]["prompt"]["messages"][0]["content"] for b in beams)


@pytest.mark.parametrize("flag, taken, message", [("--out", "a_folder", "is a folder; give a file"),
                                                 ("--plot-dir", "a_file", "is a file, not a folder")])
def test_an_output_of_the_wrong_kind_is_refused_in_one_line_before_any_work(tmp_path, flag, taken, message):
    pytest.importorskip("matplotlib")
    (tmp_path / "a_folder").mkdir()
    (tmp_path / "a_file").write_text("")
    path = tmp_path / "pool.jsonl"
    path.write_text("".join(json.dumps(t) + "\n" for t in POOL))
    result = run_cli(str(path), "--budget", "4", "--turns", "2,1", flag, str(tmp_path / taken))
    assert result.returncode != 0 and "Traceback" not in result.stderr, result.stderr
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith(f"error: {flag} {tmp_path / taken} {message}")
    assert result.stdout == ""


@pytest.mark.parametrize("flags, message", [
    (["--budget", "64"], "error: --budget 64 with --turns 2,1: no allocation fits the files, whose smallest pool has "
                         "4 trajectories of up to 2 turns; lower --budget"),
    (["--turns", "0"], "error: --turns must each be at least 1, got [0]"),
    (["--turns", "2,-1"], "error: --turns must each be at least 1, got [2, -1]"),
    (["--budget", "5", "--turns", "2"], "error: --budget 5 is not divisible by a turn count of 2"),
])
def test_flags_no_allocation_can_serve_are_a_one_line_error(tmp_path, flags, message):
    """Not a table of skipped rows with exit status 0, nor "not divisible" for a turn count of 0."""
    path = tmp_path / "pool.jsonl"
    path.write_text("".join(json.dumps(t) + "\n" for t in POOL))
    result = run_cli(str(path), "--turns", "2,1", *flags)
    assert result.returncode == 1 and result.stdout == "", result.stdout
    assert result.stderr.strip().splitlines() == [message]


@pytest.mark.parametrize("flag, name", [("--out", "scale.json"), ("--plot-dir", "plots"), ("--out-dir", "runs")])
def test_an_output_in_a_missing_folder_is_refused_as_evaluate_refuses_it(tmp_path, flag, name):
    """As evaluate.py -o and generate.py --out: a missing folder is not made, and nothing is computed first."""
    path = tmp_path / "pool.jsonl"
    path.write_text("".join(json.dumps(t) + "\n" for t in POOL))
    output = tmp_path / "no" / name
    mode = ["--live"] if flag == "--out-dir" else [str(path)]
    result = run_cli(*mode, "--budget", "4", "--turns", "2,1", flag, str(output))
    assert result.returncode == 1 and result.stdout == ""
    assert result.stderr.strip().splitlines() == [f"error: cannot write {output}: No such file or directory"]
    assert not (tmp_path / "no").exists()


def test_live_mode_refuses_generate_flags_it_sets_itself():
    result = run_cli("--live", "--generate-args=--turns 3")
    assert result.returncode != 0
    assert "must not set --turns" in result.stderr
    assert "Traceback" not in result.stderr


def test_offline_cli_without_files_says_what_it_needs():
    result = run_cli()
    assert result.returncode != 0
    assert result.stderr.strip() == "error: give one or more trajectory files, or --live"


def test_offline_cli_names_the_bad_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(POOL[0]) + "\n" + json.dumps({"task": "A"}) + "\n")
    result = run_cli(str(path))
    assert result.returncode != 0
    assert f"{path}:2: malformed trajectory" in result.stderr
    assert "Traceback" not in result.stderr


def test_help_works():
    result = run_cli("--help")
    assert result.returncode == 0
    assert "--budget" in result.stdout and "--live" in result.stdout


def test_every_config_field_is_a_flag_with_its_docstring_as_help():
    """Spaces aside: argparse wraps the help after a hyphen too (`"--backend` in --generate-args's)."""
    help_text = "".join(_parser().format_help().split())
    for name, doc in config_flags.field_docs(ScaleTestConfig).items():
        assert "".join(doc.split()) in help_text, name
    assert "(default:8,4,1)" in help_text and "(default:runs/scale_test)" in help_text
    args = _parser().parse_args(["a.jsonl", "b.jsonl", "--turns", "2,1", "--thresholds", "2", "--out", "s.json"])
    cfg = ScaleTestConfig(**config_flags.given_flags(args, ScaleTestConfig))
    assert args.files == ["a.jsonl", "b.jsonl"]
    assert cfg == ScaleTestConfig(turns=[2, 1], thresholds=[2.0], out=Path("s.json"))
    assert ScaleTestConfig(**config_flags.given_flags(_parser().parse_args([]), ScaleTestConfig)) == ScaleTestConfig()
