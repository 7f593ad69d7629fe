"""reward.py: scores, both return aggregations, normalisation, grouping and the command line."""

import argparse
import json
import math
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from kevin import config_flags
from kevin.rewards import RewardConfig, add_rewards, discounted_returns, drop_zero_advantage_groups, leave_one_out, normalise, turn_score

ROOT = Path(__file__).resolve().parent.parent


def ev(correct: bool, speedup: float | None = None) -> dict:
    return {"status": "correct" if correct else "incorrect", "correct": correct, "speedup": speedup}


def trajectory(task: str, index: int, *evals: dict) -> dict:
    return {"task": task, "trajectory": index,
            "turns": [{"turn": t, "reply": {"text": f"reply {t}"}, "eval": e} for t, e in enumerate(evals)]}


# Task A: trajectory 0 scores [0, 2] and trajectory 1 scores [1] with correct_weight 0.5;
# task B never succeeds. With gamma 0.5 and the sum, A's returns are [1, 2] and [1].
TASK_A0 = trajectory("A", 0, ev(False), ev(True, 1.5))
TASK_A1 = trajectory("A", 1, ev(True, 0.5))
TASK_B0 = trajectory("B", 0, ev(False), ev(False))
SMALL = RewardConfig(gamma=0.5, correct_weight=0.5)


def advantages(trajectories: list[dict]) -> list[list[float]]:
    return [[turn["advantage"] for turn in t["turns"]] for t in trajectories]


def test_turn_score_is_weighted_correctness_plus_speedup():
    assert turn_score(ev(True, 2.0)) == pytest.approx(2.3)
    assert turn_score(ev(True, 2.0), RewardConfig(correct_weight=1.0, speedup_weight=0.5)) == pytest.approx(2.0)


def test_turn_score_is_zero_for_an_incorrect_kernel_whatever_its_speedup():
    assert turn_score(ev(False)) == 0.0
    assert turn_score(ev(False, 5.0)) == 0.0


@pytest.mark.parametrize("speedup", [math.inf, math.nan, -1.0, None])
def test_turn_score_refuses_a_correct_kernel_whose_speedup_is_not_a_finite_number_at_least_0(speedup):
    with pytest.raises(ValueError, match="not a finite number >= 0"):
        turn_score(ev(True, speedup))


def test_online_rewards_refuse_an_infinite_speedup_and_name_the_turn():
    """train.py rewards its rollouts with add_rewards straight from evaluate.py, which times a kernel that
    runs in 0 ms as an infinite speedup: that must stop the step, not turn its advantages into nan."""
    with pytest.raises(ValueError, match="task A trajectory 0 turn 2: correct but \"speedup\" is inf"):
        add_rewards([trajectory("A", 0, ev(False), ev(True, math.inf))])


def test_discounted_sum_matches_hand_computation():
    # s = [0, 1.3, 0, 2.3], gamma 0.4: R3 = 2.3, R2 = 0.92, R1 = 1.3 + 0.368, R0 = 0.4 * 1.668
    assert discounted_returns([0, 1.3, 0, 2.3], gamma=0.4, mode="sum") == pytest.approx([0.6672, 1.668, 0.92, 2.3])


def test_discounted_max_matches_hand_computation():
    # R0 = max(0, 0.4 * 1.3, 0.16 * 0, 0.064 * 2.3) = 0.52
    assert discounted_returns([0, 1.3, 0, 2.3], gamma=0.4, mode="max") == pytest.approx([0.52, 1.3, 0.92, 2.3])


def test_discounted_max_equals_its_definition_on_every_turn():
    scores, gamma = [0.3, 0.0, 2.5, 1.1, 0.0, 4.0], 0.8
    expected = [max(gamma ** (i - t) * scores[i] for i in range(t, len(scores))) for t in range(len(scores))]
    assert discounted_returns(scores, gamma, "max") == pytest.approx(expected)


def test_gamma_zero_gives_each_turn_its_own_score():
    assert discounted_returns([1.0, 0.0, 3.0], gamma=0.0) == [1.0, 0.0, 3.0]


def test_unknown_mode_is_refused():
    with pytest.raises(ValueError, match="mode"):
        discounted_returns([1.0], mode="mean")


def test_normalise_uses_the_sample_std_as_trl_and_verl():
    # mean 1, sample std sqrt 2 (the population std would be 1)
    r = math.sqrt(2)
    assert normalise([0.0, 2.0], eps=0.0) == pytest.approx([-1 / r, 1 / r])
    assert normalise([0.0, 2.0], eps=1e-6) == pytest.approx([-1 / (r + 1e-6), 1 / (r + 1e-6)], rel=1e-12)
    torch = pytest.importorskip("torch")  # torch.std's default, which TRL and verl take
    returns = torch.tensor([0.3, 1.2, 0.0, 2.5])
    assert normalise(returns.tolist(), eps=0.0) == pytest.approx(((returns - returns.mean()) / returns.std()).tolist())


def test_normalise_matches_hand_computation_on_four_values():
    # mean 2.5, sample variance 5 / 3
    s = math.sqrt(5 / 3)
    assert normalise([1.0, 2.0, 3.0, 4.0], eps=0.0) == pytest.approx([-1.5 / s, -0.5 / s, 0.5 / s, 1.5 / s])


def test_normalise_gives_exact_zeros_when_all_returns_are_equal():
    assert normalise([0.1, 0.1, 0.1]) == [0.0, 0.0, 0.0]
    assert normalise([7.0]) == [0.0]


def test_group_by_task_pools_trajectories_of_different_lengths():
    out = add_rewards([TASK_A0, TASK_A1, TASK_B0], replace(SMALL, group_by="task"))
    assert [[t["score"] for t in x["turns"]] for x in out] == [[0.0, 2.0], [1.0], [0.0, 0.0]]
    assert [[t["return"] for t in x["turns"]] for x in out] == [[1.0, 2.0], [1.0], [0.0, 0.0]]
    # task A returns [1, 2, 1]: mean 4/3, sample std 1/sqrt(3), eps 1e-6
    std = 1 / math.sqrt(3) + 1e-6
    assert advantages(out)[:2] == [pytest.approx([-1 / 3 / std, 2 / 3 / std]), pytest.approx([-1 / 3 / std])]
    assert advantages(out)[2] == [0.0, 0.0]  # task B: a zero-std group


def test_group_by_task_turn_normalises_each_turn_apart():
    out = add_rewards([TASK_A0, TASK_A1, TASK_B0], replace(SMALL, group_by="task-turn"))
    # A turn 0: returns [1, 1]; A turn 1: one sample; B: all zero -> every group has zero std
    assert advantages(out) == [[0.0, 0.0], [0.0], [0.0, 0.0]]


def test_group_by_trajectory_normalises_within_each_trajectory():
    out = add_rewards([TASK_A0, TASK_A1, TASK_B0], replace(SMALL, group_by="trajectory"))
    # trajectory 0 returns [1, 2]: mean 1.5, sample std sqrt(0.5)
    half = 0.5 / (math.sqrt(0.5) + 1e-6)
    assert advantages(out) == [pytest.approx([-half, half]), [0.0], [0.0, 0.0]]


def test_leave_one_out_subtracts_the_mean_of_the_other_returns():
    # 1 - (2 + 3) / 2, 2 - (1 + 3) / 2, 3 - (1 + 2) / 2
    assert leave_one_out([1.0, 2.0, 3.0]) == [-1.5, 0.0, 1.5]
    assert leave_one_out([0.0, 4.0]) == [-4.0, 4.0]  # no std: the returns' own scale


def test_leave_one_out_gives_exact_zeros_to_equal_returns_and_a_lone_sample_its_return():
    assert leave_one_out([0.1, 0.1, 0.1]) == [0.0, 0.0, 0.0]  # (0.3 - 0.1) / 2 would round to 0.10000000000000002
    assert leave_one_out([7.0]) == [7.0]  # TRLOO (KernelGYM): no other sample, no baseline


def test_leave_one_out_baseline_uses_the_groups_of_group_by():
    out = add_rewards([TASK_A0, TASK_A1, TASK_B0], replace(SMALL, baseline="leave-one-out"))
    # task A returns [1, 2] and [1]: 1 - (2 + 1) / 2, 2 - (1 + 1) / 2, 1 - (1 + 2) / 2; task B all zero
    assert advantages(out) == [[-0.5, 1.0], [-0.5], [0.0, 0.0]]
    # per task and turn (Dr. Kernel's TRLOO): A turn 1 returns [1, 1], A turn 2 a lone sample (its return), B zero
    out = add_rewards([TASK_A0, TASK_A1, TASK_B0], replace(SMALL, baseline="leave-one-out", group_by="task-turn"))
    assert advantages(out) == [[0.0, 2.0], [0.0], [0.0, 0.0]]


def test_a_turn_left_out_has_no_advantage_and_no_place_in_its_groups_baseline():
    """train.py's truncated replies under --mask-truncated: scored, so earlier turns' returns hold them, but out of
    the loss and out of the baseline of the samples that are in it."""
    def cut(turn: dict) -> bool:  # A0's second turn
        return turn["reply"] is TASK_A0["turns"][1]["reply"]

    out = add_rewards([TASK_A0, TASK_A1, TASK_B0], replace(SMALL, baseline="leave-one-out"), left_out=cut)
    assert [t["return"] for t in out[0]["turns"]] == [1.0, 2.0]  # its score still counts in turn 1's return
    # task A's group is now A0's turn 1 and A1's: returns 1 and 1
    assert advantages(out) == [[0.0, None], [0.0], [0.0, 0.0]]


def test_turns_from_the_first_not_evaluated_have_no_reward_and_no_place_in_a_group():
    """A kernel the evaluator had no room for is no fault of the policy's: no score, and the turns after it (whose
    prompts quote that feedback) have none either; the turns before it are credited for what they led to."""
    unjudged = {"status": "runtime_error", "correct": False, "speedup": None, "not_evaluated": True}
    a0 = trajectory("A", 0, ev(True, 1.5), unjudged, ev(True, 3.5))
    a1 = trajectory("A", 1, ev(False), ev(True, 0.5))
    out = add_rewards([a0, a1], SMALL)
    assert [(t["score"], t["return"]) for t in out[0]["turns"]] == [(2.0, 2.0), (None, None), (None, None)]
    assert [t["return"] for t in out[1]["turns"]] == [0.5, 1.0]
    # task A's group: returns [2, 0.5, 1], mean 7/6; the unjudged turns have no advantage
    mean = 7 / 6
    std = math.sqrt(((2 - mean) ** 2 + (0.5 - mean) ** 2 + (1 - mean) ** 2) / 2) + 1e-6
    assert advantages(out) == [pytest.approx([(2 - mean) / std, None, None]),
                               pytest.approx([(0.5 - mean) / std, (1 - mean) / std])]


def test_zero_advantage_groups_are_dropped_and_the_rest_kept():
    out = add_rewards([TASK_A0, TASK_A1, TASK_B0], SMALL)
    assert [len(t["turns"]) for t in drop_zero_advantage_groups(out, "task")] == [2, 1, 0]  # task B goes
    # per task and turn: scores [0, 1.5] and [0.75, 1.5] give returns [0.75, 1.5] and [1.5, 1.5]; turn 2 agrees
    d0, d1 = trajectory("D", 0, ev(False), ev(True, 1.0)), trajectory("D", 1, ev(True, 0.25), ev(True, 1.0))
    out = add_rewards([d0, d1], replace(SMALL, group_by="task-turn"))
    kept = drop_zero_advantage_groups(out, "task-turn")
    assert [[turn["turn"] for turn in t["turns"]] for t in kept] == [[0], [0]]
    one = 0.375 / (0.375 * math.sqrt(2) + 1e-6)  # turn 1: mean 1.125, sample std 0.375 sqrt 2
    assert [t["turns"][0]["advantage"] for t in kept] == pytest.approx([-one, one])


def test_add_rewards_with_discounted_max():
    out = add_rewards([TASK_A0], RewardConfig(gamma=0.5, return_mode="max", correct_weight=0.5))
    assert [t["return"] for t in out[0]["turns"]] == [1.0, 2.0]  # max(0, 0.5 * 2), 2


def test_add_rewards_keeps_other_fields_and_leaves_its_input_unchanged():
    out = add_rewards([TASK_A0])
    assert out[0]["turns"][0]["reply"] == {"text": "reply 0"}
    assert out[0]["trajectory"] == 0
    assert "score" not in TASK_A0["turns"][0]


def run_cli(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "reward.py"), *args], input=stdin,
                          capture_output=True, text=True, cwd=ROOT, timeout=60)


def test_cli_round_trip_writes_rewards_and_a_summary(tmp_path):
    path = tmp_path / "rollouts.jsonl"
    path.write_text("".join(json.dumps(t) + "\n" for t in (TASK_A0, TASK_A1, TASK_B0)))
    result = run_cli(str(path), "--gamma", "0.5", "--correct-weight", "0.5")
    assert result.returncode == 0, result.stderr
    out = [json.loads(line) for line in result.stdout.splitlines()]
    assert out == add_rewards([TASK_A0, TASK_A1, TASK_B0], SMALL)
    # turns numbered from 1, as generate.py numbers them
    # turn 1: scores [0, 1, 0], returns [1, 1, 0], 1 of 3 correct; turn 2: scores [2, 0], 1 of 2 correct
    assert "   1        3      0.3333       0.6667    33.3%" in result.stderr
    assert "   2        2      1.0000       1.0000    50.0%" in result.stderr
    assert "groups (by task): 2, with zero std (advantage 0): 1" in result.stderr


def test_cli_reads_stdin_and_honours_return_mode_and_group_by():
    result = run_cli("-", "--gamma", "0.5", "--correct-weight", "0.5", "--return-mode", "max", "--group-by", "trajectory",
                     stdin=json.dumps(TASK_A0) + "\n\n")
    assert result.returncode == 0, result.stderr
    (out,) = [json.loads(line) for line in result.stdout.splitlines()]
    half = 0.5 / (math.sqrt(0.5) + 1e-6)  # returns [1, 2]: mean 1.5, sample std sqrt(0.5)
    assert [(t["return"], t["advantage"]) for t in out["turns"]] == [(1.0, pytest.approx(-half)), (2.0, pytest.approx(half))]


def test_cli_on_empty_input_says_there_are_no_rows():
    result = run_cli("-", stdin="\n")
    assert result.returncode == 0 and result.stdout == ""
    assert result.stderr.strip() == "no rows: the input holds no trajectories"


def test_cli_names_the_line_of_invalid_json(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(TASK_A0) + "\n{not json\n")
    result = run_cli(str(path))
    assert result.returncode != 0
    assert f"{path}:2: malformed trajectory" in result.stderr
    assert "Traceback" not in result.stderr
    assert result.stdout == ""


def test_cli_names_the_line_and_turn_of_a_correct_kernel_without_speedup(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(trajectory("A", 0, ev(False), ev(True, None))) + "\n")
    result = run_cli(str(path))
    assert result.returncode != 0
    assert f"{path}:1: malformed trajectory: turn 2: correct but \"speedup\" is None" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.slow
@pytest.mark.parametrize("stage", [["reward.py"], ["scale_test.py"], ["train.py", "--rollouts"]])
def test_a_trajectory_written_twice_is_refused_naming_its_first_copy(tmp_path, stage):
    """Two runs on one file, or one file appended to twice: every stage reading rollouts reads them through
    reward.load_trajectories, which names the first duplicate instead of counting its turns twice."""
    path = tmp_path / "rollouts.jsonl"
    path.write_text("".join(json.dumps(t) + "\n" for t in (TASK_A0, TASK_A1, TASK_B0, TASK_A1, TASK_A0)))
    result = subprocess.run([sys.executable, str(ROOT / stage[0]), *stage[1:], str(path)], capture_output=True,
                            text=True, cwd=ROOT, timeout=120)
    assert result.returncode == 1 and result.stdout == "" and "Traceback" not in result.stderr, result.stderr
    assert result.stderr.strip().splitlines()[-1] == (f"error: {path}:4: duplicate record: task A trajectory 1, "
                                                      "already at line 2; keep one copy")


def test_cli_refuses_a_trajectory_without_its_id(tmp_path):
    path = tmp_path / "rollouts.jsonl"
    path.write_text(json.dumps({k: v for k, v in TASK_A0.items() if k != "trajectory"}) + "\n")
    result = run_cli(str(path))
    assert result.returncode == 1
    assert result.stderr.strip() == f'error: {path}:1: malformed trajectory: missing integer field "trajectory"'


def test_cli_reports_a_missing_file_in_one_line(tmp_path):
    result = run_cli(str(tmp_path / "absent.jsonl"))
    assert result.returncode != 0
    assert result.stderr.strip().startswith("error: cannot read")
    assert "Traceback" not in result.stderr


def test_cli_piped_into_a_reader_that_stops_early_exits_quietly(tmp_path):
    """`python reward.py FILE | head -c 10`: the reader gone, reward.py stops as Unix tools do, without a
    traceback. Our end of the pipe is closed before it writes, so its first write meets no reader."""
    path = tmp_path / "rollouts.jsonl"
    path.write_text(json.dumps(TASK_A0) + "\n")
    proc = subprocess.Popen([sys.executable, str(ROOT / "reward.py"), str(path)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=ROOT)
    proc.stdout.close()
    stderr = proc.stderr.read()
    assert proc.wait(timeout=60) != 0
    assert stderr == ""


def test_cli_help_lists_every_flag():
    result = run_cli("--help")
    assert result.returncode == 0
    for flag in ("--gamma", "--return-mode", "--correct-weight", "--speedup-weight", "--group-by", "--baseline",
                 "--eps"):
        assert flag in result.stdout


def test_every_config_field_is_a_flag_with_its_docstring_as_help():
    """reward.py's flags, of which train.py shares all but --eps; a flag not given keeps RewardConfig's default."""
    p = argparse.ArgumentParser()
    config_flags.add_config_flags(p, RewardConfig)
    help_text = " ".join(p.format_help().split())
    for name, doc in config_flags.field_docs(RewardConfig).items():
        assert doc in help_text, name
    assert config_flags.parse_config(p, RewardConfig, []) == RewardConfig()
    given = config_flags.parse_config(p, RewardConfig, ["--gamma", "0.8", "--baseline", "leave-one-out", "--eps", "0.1"])
    assert given == RewardConfig(gamma=0.8, baseline="leave-one-out", eps=0.1)
    with pytest.raises(SystemExit, match=r"^error: --gamma must be between 0 and 1, got 1.5$"):
        config_flags.parse_config(p, RewardConfig, ["--gamma", "1.5"])
    shared = argparse.ArgumentParser()
    config_flags.add_config_flags(shared, RewardConfig, leave_out=("eps",))
    assert "--eps" not in shared.format_help() and config_flags.parse_config(shared, RewardConfig, []) == RewardConfig()
