"""Learning curves from train.py's per-step metrics (its --log lines): the numbers per step and their plot, for
train.py (one run) and bench/learning_demo.py and bench/kevin_table.py (several runs and seeds)."""
from __future__ import annotations

from pathlib import Path


def mean(values) -> float:
    """The mean, NaN for no values (a curve with nothing at a step)."""
    values = list(values)
    return sum(values) / len(values) if values else float("nan")


def turns_of(metrics: list[dict]) -> list[int]:
    """The turn numbers a run's metrics report a score for (reward/score_turn<t>), in order."""
    return sorted(int(k.removeprefix("reward/score_turn")) for k in metrics[0] if k.startswith("reward/score_turn"))


def curves(metrics: list[dict]) -> dict[str, list]:
    """Per step: the mean turn score, the share correct, and the score of each turn (one list per step)."""
    turns = turns_of(metrics)
    return {"score_per_step": [m["reward/score"] for m in metrics],
            "correct_per_step": [m["reward/correct"] for m in metrics],
            "turn_per_step": [[m[f"reward/score_turn{t}"] for t in turns] for m in metrics]}


def pyplot():
    """matplotlib's pyplot without a screen."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_steps(ax, groups: dict[str, list[list[float]]], ylabel: str, title: str) -> None:
    """One colour per group (label -> one curve per run): each run thin, their mean per step thick."""
    for (label, runs), colour in zip(groups.items(), ("tab:blue", "tab:orange", "tab:green", "tab:red")):
        if len(runs) > 1:
            for curve in runs:
                ax.plot(range(1, len(curve) + 1), curve, color=colour, alpha=0.3, linewidth=1)
        steps = min(len(c) for c in runs)
        ax.plot(range(1, steps + 1), [mean(c[i] for c in runs) for i in range(steps)], color=colour, linewidth=2.5,
                marker="o" if len(runs) == 1 else None,
                label=label if len(runs) == 1 else f"{label} (mean of {len(runs)} seeds)")
    ax.set(xlabel="GRPO step", ylabel=ylabel, title=title)
    ax.legend()


def plot_run(metrics: list[dict], path: Path, title: str) -> Path:
    """One run's curve, written to `path`: mean turn score and share correct per step, and each turn's score per step
    (does a later turn, which reads the evaluator's feedback, score more than the first?)."""
    plt = pyplot()
    c = curves(metrics)
    fig, (score, correct, per_turn) = plt.subplots(1, 3, figsize=(15, 4))
    plot_steps(score, {"mean turn score": [c["score_per_step"]]}, "mean turn score", "score per step")
    plot_steps(correct, {"share correct": [c["correct_per_step"]]}, "share of kernels correct", "correct per step")
    by_turn = {f"turn {t}": [[row[i] for row in c["turn_per_step"]]] for i, t in enumerate(turns_of(metrics))}
    plot_steps(per_turn, by_turn, "mean score", "score per turn")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
