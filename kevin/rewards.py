"""The reward math that reward.py, train.py and warm_start.py share (reward.py's docstring gives the formulas):
scores, discounted returns, advantages within a group, and the trajectory files they read."""
from __future__ import annotations

import json
import math
import sys
from collections import defaultdict
from dataclasses import asdict, dataclass
from typing import Iterable, Literal

from kevin.config_flags import POSITIVE, SHARE, check, one_of

RETURN_MODES = ("sum", "max")
GROUP_BY = ("task", "task-turn", "trajectory")


@dataclass(frozen=True)
class RewardConfig:
    """How a kernel is scored and a turn credited: the paper's defaults, written here only; each field is a
    flag of reward.py (kevin/config_flags.py), and all but eps of train.py too."""
    correct_weight: float = 0.3
    """score of any correct kernel"""
    speedup_weight: float = 1.0
    """score per unit of speedup over eager, correct kernels only (no clipping)"""
    gamma: float = 0.4
    """discount per turn (paper: 0.4 with the sum, 0.8 with the max)"""
    return_mode: Literal["sum", "max"] = "sum"
    """discounted sum or discounted max of later scores"""
    group_by: Literal["task", "task-turn", "trajectory"] = "task"
    """advantage groups: all of a task's turn-samples, a task's samples at one turn, or one trajectory"""
    baseline: Literal["group", "leave-one-out"] = "group"
    """group: (R - mean) / std over the group (the paper's); leave-one-out: R - mean of the group's other returns,
    no std (TRLOO, Dr. Kernel; with --group-by task-turn as there)"""
    eps: float = 1e-6
    """added to the std before dividing"""

    def __post_init__(self):
        """A discount outside [0, 1] would let later turns outweigh earlier ones (or flip their sign), and a
        zero eps would divide by zero."""
        check(self, {"gamma": SHARE, "eps": POSITIVE, "return_mode": one_of(*RETURN_MODES),
                     "group_by": one_of(*GROUP_BY)})


# ---------------------------------------------------------------- math
def turn_score(result: dict, config: RewardConfig = RewardConfig()) -> float:
    """Reward of one kernel (an eval record): only correct kernels earn anything, faster ones earn more.

    The one check that a speedup is a finite number >= 0, for files and online rollouts alike: an infinite
    one (a kernel timed at 0 ms) would make every return and advantage of its group inf or nan."""
    if not result["correct"]:
        return 0.0
    speedup = result.get("speedup")
    if not (isinstance(speedup, (int, float)) and math.isfinite(speedup) and speedup >= 0):
        raise ValueError(f'correct but "speedup" is {speedup!r}, not a finite number >= 0')
    return config.correct_weight + config.speedup_weight * float(speedup)


def discounted_returns(scores: list[float], gamma: float = RewardConfig.gamma,
                       mode: str = RewardConfig.return_mode) -> list[float]:
    """R_t = sum (or max) over i >= t of gamma^(i-t) s_i, so a turn is credited for what it led to."""
    if mode not in RETURN_MODES:
        raise ValueError(f"mode must be 'sum' or 'max', got {mode!r}")
    returns = [0.0] * len(scores)
    later = None  # R_{t+1}
    for t in reversed(range(len(scores))):
        if later is None:
            returns[t] = scores[t]
        elif mode == "sum":
            returns[t] = scores[t] + gamma * later
        else:  # gamma >= 0, so max_{i>=t} gamma^(i-t) s_i = max(s_t, gamma * R_{t+1})
            returns[t] = max(scores[t], gamma * later)
        later = returns[t]
    return returns


def normalise(returns: list[float], eps: float = RewardConfig.eps) -> list[float]:
    """(R - mean) / (std + eps) with the sample std (divide by n - 1), as TRL's and verl's GRPO take it."""
    if not returns:
        return []
    if max(returns) == min(returns):  # exact zeros, not rounding noise divided by eps
        return [0.0] * len(returns)
    mean = sum(returns) / len(returns)
    std = math.sqrt(sum((r - mean) ** 2 for r in returns) / (len(returns) - 1))
    return [(r - mean) / (std + eps) for r in returns]


def leave_one_out(returns: list[float]) -> list[float]:
    """R_i - mean of the other returns: a baseline that does not hold the sample itself (RLOO, no std). A sample
    alone in its group has no other to compare with: its advantage is its return, as TRLOO (KernelGYM) takes it."""
    if len(returns) == 1:
        return list(returns)
    if max(returns, default=0.0) == min(returns, default=0.0):  # exact zeros
        return [0.0] * len(returns)
    total, others = sum(returns), len(returns) - 1
    return [r - (total - r) / others for r in returns]


def group_key(trajectory_index: int, task: str, turn: int, group_by: str) -> tuple:
    """Which advantage group a turn-sample falls in."""
    if group_by == "task":
        return (task,)
    if group_by == "task-turn":
        return (task, turn)
    if group_by == "trajectory":  # by position: one group per trajectory record
        return (trajectory_index,)
    raise ValueError(f"group_by must be one of {GROUP_BY}, got {group_by!r}")


def trajectory_scores(trajectory: dict, config: RewardConfig) -> list[float]:
    """The score of each turn; a turn whose score cannot be computed is named in the error."""
    scores = []
    for t, turn in enumerate(trajectory["turns"], 1):
        try:
            scores.append(turn_score(turn["eval"], config))
        except ValueError as error:
            raise ValueError(f"task {trajectory['task']} trajectory {trajectory.get('trajectory')} "
                             f"turn {t}: {error}") from None
    return scores


def judged_turns(trajectory: dict) -> int:
    """How many of its turns, from the first, have a verdict on the kernel: a turn the evaluator could not evaluate
    (`not_evaluated`: no room for it, no fault of the kernel's) has no score, and the turns after it, prompted with
    that feedback, no place in the returns."""
    return next((t for t, turn in enumerate(trajectory["turns"]) if turn["eval"].get("not_evaluated")),
                len(trajectory["turns"]))


def add_rewards(trajectories: list[dict], config: RewardConfig = RewardConfig(), left_out=None) -> list[dict]:
    """Copies of the trajectories whose turns carry "score", "return" and "advantage", each naming the settings
    that made them (`rewarded_with`: a later stage given other flags can tell). Turns that are no sample of the
    policy's reward get None: from the first not evaluated on (`judged_turns`: none of them has a score), and those
    `left_out(turn)` names (train.py's truncated replies under --mask-truncated: scored, but out of the loss and
    so out of their group's baseline)."""
    out = []
    groups = defaultdict(list)  # key -> [(trajectory index, turn index)]
    for i, trajectory in enumerate(trajectories):
        judged = judged_turns(trajectory)
        scores = trajectory_scores({**trajectory, "turns": trajectory["turns"][:judged]}, config)
        returns = discounted_returns(scores, config.gamma, config.return_mode)
        turns = [{**turn, "score": s, "return": r, "advantage": None}
                 for turn, s, r in zip(trajectory["turns"], scores, returns)]
        turns += [{**turn, "score": None, "return": None, "advantage": None} for turn in trajectory["turns"][judged:]]
        out.append({**trajectory, "turns": turns, "rewarded_with": asdict(config)})
        for t in range(judged):
            if left_out is None or not left_out(turns[t]):
                groups[group_key(i, trajectory["task"], t, config.group_by)].append((i, t))
    for members in groups.values():
        returns = [out[i]["turns"][t]["return"] for i, t in members]
        advantages = normalise(returns, config.eps) if config.baseline == "group" else leave_one_out(returns)
        for (i, t), advantage in zip(members, advantages):
            out[i]["turns"][t]["advantage"] = advantage
    return out


def drop_zero_advantage_groups(trajectories: list[dict], group_by: str) -> list[dict]:
    """Copies without the turns of groups whose advantages are all 0: they add no gradient, only compute
    (DAPO's dynamic sampling, without drawing new groups to refill the batch)."""
    keys = [[group_key(i, trajectory["task"], t, group_by) for t in range(len(trajectory["turns"]))]
            for i, trajectory in enumerate(trajectories)]
    informative = {key for trajectory, row in zip(trajectories, keys)
                   for turn, key in zip(trajectory["turns"], row) if turn["advantage"] not in (0, None)}
    return [{**trajectory, "turns": [turn for turn, key in zip(trajectory["turns"], row) if key in informative]}
            for trajectory, row in zip(trajectories, keys)]


# ---------------------------------------------------------------- input
def check_trajectory(record) -> None:
    """Raise ValueError naming the first field that reward.py cannot use."""
    if not isinstance(record, dict):
        raise ValueError("expected a JSON object")
    if not isinstance(record.get("task"), str):
        raise ValueError('missing string field "task"')
    if not isinstance(record.get("trajectory"), int):
        raise ValueError('missing integer field "trajectory"')
    if not isinstance(record.get("turns"), list):
        raise ValueError('missing list field "turns"')
    for t, turn in enumerate(record["turns"], 1):
        ev = turn.get("eval") if isinstance(turn, dict) else None
        if not isinstance(ev, dict) or not isinstance(ev.get("correct"), bool):
            raise ValueError(f'turn {t}: missing "eval" with a boolean "correct"')
        try:
            turn_score(ev)
        except ValueError as error:
            raise ValueError(f"turn {t}: {error}") from None


def read_trajectories(lines: Iterable[str], source: str) -> list[dict]:
    """Parse JSONL trajectories; a bad line stops the run with its file name and line number, and so does a
    (task, trajectory) read before (a file written twice over): its turns would count twice in every group."""
    trajectories, first_seen = [], {}
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            check_trajectory(record)
        except ValueError as err:  # json.JSONDecodeError is a ValueError
            raise SystemExit(f"error: {source}:{number}: malformed trajectory: {err}") from None
        key = (record["task"], record["trajectory"])
        if key in first_seen:
            raise SystemExit(f"error: {source}:{number}: duplicate record: task {key[0]} trajectory {key[1]}, "
                             f"already at line {first_seen[key]}; keep one copy")
        first_seen[key] = number
        trajectories.append(record)
    return trajectories


def load_trajectories(path: str) -> list[dict]:
    """Read a JSONL file, or stdin for '-'."""
    if path == "-":
        return read_trajectories(sys.stdin, "<stdin>")
    try:
        with open(path) as f:
            return read_trajectories(f, path)
    except OSError as err:
        raise SystemExit(f"error: cannot read {path}: {err.strerror}") from None
