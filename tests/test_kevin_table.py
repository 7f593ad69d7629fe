"""bench/kevin_table.py: its numbers from small hand-made pools, their mean and spread over seeds, and the verdict."""
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
import kevin_table as kt  # noqa: E402


def ev(correct: bool, speedup: float = 0.0) -> dict:
    return {"correct": correct, "speedup": speedup if correct else None}


# one task, two trajectories of two turns: A fails then is correct at 2x, B is correct at 1x then fails
POOLS = {"level1/t": [[ev(False), ev(True, 2.0)], [ev(True, 1.0), ev(False)]]}


def test_one_seeds_report_scores_every_allocation_each_turn_and_each_k_by_hand():
    report = kt.seed_report(POOLS, budget=2, turns=2, pool=2)
    assert list(report["allocations"]) == ["1x2", "2x1"]
    serial, parallel = report["allocations"]["1x2"], report["allocations"]["2x1"]
    # 1 x 2: k = 1 over A (correct, 2x) and B (correct, 1x): the mean of the two
    assert (serial["correct_best"], serial["speedup_best"], serial["fast_1.0"]) == (1.0, 1.5, 1.0)
    # 2 x 1: first turns only, A wrong and B 1x, best of both
    assert (parallel["correct_best"], parallel["correct_avg"], parallel["speedup_best"]) == (1.0, 0.5, 1.0)
    assert [(r["correct_avg"], r["speedup_avg"]) for r in report["per_turn"]] == [(0.5, 0.5), (1.0, 1.5)]
    assert [(r["correct_best"], r["speedup_best"]) for r in report["per_k"]] == [(0.5, 0.5), (1.0, 1.0)]


def test_allocations_need_a_pool_that_holds_them():
    assert list(kt.seed_report(POOLS, budget=2, turns=2, pool=1)["allocations"]) == ["1x2"]  # 2 x 1 needs k = 2


def reports(speedups: dict[str, list[float]]) -> dict:
    """kind -> seed -> a report whose only allocation has these best@k speedups (one per seed)."""
    def one(s: float) -> dict:
        metrics = {"correct_best": min(1.0, s), "correct_avg": 0.5, "speedup_best": s, "speedup_avg": s / 2,
                   "fast_1.0": float(s >= 1)}
        return {"allocations": {"1x8": metrics}, "per_turn": [metrics], "per_k": [metrics]}
    return {kind: {seed: one(s) for seed, s in enumerate(values, 1)} for kind, values in speedups.items()}


def test_aggregate_keeps_each_number_per_seed_and_the_verdict_takes_the_per_seed_differences():
    agg = kt.aggregate(reports({"warm": [0.5, 0.5, 0.5], "multi": [1.2, 1.0, 0.8], "single": [1.0, 1.0, 1.0]}))
    assert agg["multi"]["allocations"]["1x8"]["speedup_best"] == [1.2, 1.0, 0.8]
    v = kt.verdict(agg, "1x8")
    assert v["speedup_best_diff"][0] == pytest.approx(0.0, abs=1e-12)  # +0.2, 0, -0.2
    assert v["speedup_best_diff"][1] == pytest.approx((0.08 / 3) ** 0.5)  # population std
    assert (v["seeds_multi_ahead"], v["seeds"], v["multi_beat_single"]) == (1, 3, False)
    assert kt.verdict(kt.aggregate(reports({"warm": [0.5], "multi": [1.5], "single": [1.0]})), "1x8")[
        "multi_beat_single"]


def test_cells_give_the_mean_and_the_spread_over_seeds():
    assert kt.cell([1.0, 2.0, 3.0]) == "2.00x ± 0.82"
    assert kt.cell([0.5, 1.0], percent=True) == "75% ± 25%"
    assert kt.spread([]) != kt.spread([])  # NaN: nothing to average


def test_the_markdown_says_the_command_every_section_and_the_verdict_in_words(tmp_path):
    agg = kt.aggregate(reports({"warm": [0.5, 0.5, 0.5], "multi": [1.5, 1.4, 1.6], "single": [1.0, 1.1, 0.9]}))
    training = {k: {"score_first": [0.1] * 3, "score_last": [0.4] * 3, "correct_first": [0.2] * 3,
                    "correct_last": [0.6] * 3} for k in ("multi", "single")}
    settings = {"device": "cpu", "policy": "p", "seeds": 3, "steps": 4, "train_tasks": "a", "multi": "2 x 2",
                "single": "4 x 1", "kernels_per_step": 4, "heldout_tasks": "b", "pool": 8, "eval_turns": 1, "budget": 8,
                "near_misses": 3, "wrong_misses": 11}
    text = kt.markdown(agg, training, [kt.verdict(agg, "1x8")], settings, "python bench/kevin_table.py --device cpu")
    assert "    python bench/kevin_table.py --device cpu" in text
    for section in ("## Training", "## Held-out, 8 kernels", "## Held-out, serial", "## Held-out, parallel",
                    "## Verdict"):
        assert section in text
    verdict = "multi-turn RL beat single-turn RL on held-out speedup best@k: multi - single +0.50x ± 0.16 (multi ahead"
    assert verdict in text  # per seed +0.5, +0.3, +0.7
    assert "| multi-turn RL | 1 x 8 | 100% ± 0% |" in text
    assert "| multi-turn RL | 0.10 ± 0.00 | 0.40 ± 0.00 |" in text  # training scores, no x
    assert kt.cell([0.25, 0.35], unit="") == "0.30 ± 0.05"  # a score, not a speedup
    assert "also seen 11 near misses of its correct kernels (3 drawn from each" in text
    assert "- refinement, multi-turn RL: one trajectory correct by turn 1 minus by turn 1 +0% ± 0%." in text


def test_an_out_dir_whose_runs_another_policy_made_is_refused_not_taken_as_finished(tmp_path):
    kt.claim_out_dir(tmp_path, "cpu-2x128-aaa")
    (tmp_path / "runs").mkdir()
    kt.claim_out_dir(tmp_path, "cpu-2x128-aaa")  # its own runs: goes on
    with pytest.raises(SystemExit, match="holds runs of another policy than cpu-2x128-bbb"):
        kt.claim_out_dir(tmp_path, "cpu-2x128-bbb")
    (tmp_path / "policy.txt").unlink()  # runs made before the marker: whose, unknown
    with pytest.raises(SystemExit, match="another policy"):
        kt.claim_out_dir(tmp_path, "cpu-2x128-aaa")
