"""Turn scores, discounted returns and group-normalised advantages for multi-turn rollouts.

Reads trajectories written by generate.py and adds three floats to every turn:
  score      s = correct_weight * 1{correct} + speedup_weight * speedup * 1{correct}
  return     R_t = sum_{i>=t} gamma^(i-t) s_i           (--return-mode sum, the paper's choice)
             R_t = max_{i>=t} gamma^(i-t) s_i           (--return-mode max, the paper's alternative)
  advantage  (R - mean) / (std + eps) over a group of turn-samples  (--baseline group, the paper's)
             R - mean of the group's other returns                  (--baseline leave-one-out)

Paper defaults: correct_weight 0.3, speedup_weight 1.0 (speedup over PyTorch eager, no clipping),
gamma 0.4 with the discounted sum, advantages normalised over all of a task's turn-samples
(trajectories x turns). The paper found gamma 0.8 better for the discounted max at few turns.
These live in `RewardConfig` (kevin/rewards.py, with the math that train.py shares); this file is the command
line and its summary.

Run:
  python reward.py rollouts.jsonl > rewarded.jsonl
  cat rollouts.jsonl | python reward.py - --return-mode max --gamma 0.8 > rewarded.jsonl

Turns are numbered from 1 in tables and errors, as generate.py numbers them in its records.

The leave-one-out baseline (TRLOO, Dr. Kernel, arXiv 2602.05885) keeps a sample's own return out of its
baseline: the group mean holds it, which shrinks a group's expected gradient by (n - 1) / n, unevenly when
groups differ in size. Like RLOO it does not divide by the std. Dr. Kernel takes it per turn: --group-by task-turn.

Simplifications: a turn's position in its "turns" list is its turn index; trajectories of one task
may have different numbers of turns and are pooled as they are. A group whose returns are all equal
gets advantage 0 everywhere (it carries no learning signal).
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
from collections import defaultdict

from kevin.config_flags import add_config_flags, config_from
from kevin.rewards import RewardConfig, add_rewards, group_key, load_trajectories


# ---------------------------------------------------------------- summary
def summary_table(trajectories: list[dict], group_by: str) -> str:
    """Per turn (from 1): samples, mean score, mean return, share correct; then the zero-std group count."""
    if not trajectories:
        return "no rows: the input holds no trajectories"
    by_turn = defaultdict(list)
    groups = defaultdict(list)
    for i, trajectory in enumerate(trajectories):
        for t, turn in enumerate(trajectory["turns"], 1):
            if turn["score"] is None:  # not evaluated: no sample of the reward
                continue
            by_turn[t].append(turn)
            groups[group_key(i, trajectory["task"], t, group_by)].append(turn["return"])
    lines = [f"{'turn':>4} {'samples':>8} {'mean score':>11} {'mean return':>12} {'correct':>8}"]
    for t in sorted(by_turn):
        turns = by_turn[t]
        n = len(turns)
        lines.append(f"{t:>4} {n:>8} {sum(x['score'] for x in turns) / n:>11.4f} "
                     f"{sum(x['return'] for x in turns) / n:>12.4f} "
                     f"{sum(x['eval']['correct'] for x in turns) / n:>8.1%}")
    zero_std = sum(max(r) == min(r) for r in groups.values())
    lines.append(f"groups (by {group_by}): {len(groups)}, with zero std (advantage 0): {zero_std}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("input", help="trajectory JSONL from generate.py, or - for stdin")
    add_config_flags(p, RewardConfig)
    args = p.parse_args(argv)
    config = config_from(args, RewardConfig)

    trajectories = add_rewards(load_trajectories(args.input), config)
    for trajectory in trajectories:
        sys.stdout.write(json.dumps(trajectory) + "\n")
    print(summary_table(trajectories, config.group_by), file=sys.stderr)


if __name__ == "__main__":
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # `| head`: a reader that stops early ends us quietly, as cat
    main()
