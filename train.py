"""GRPO on multi-turn kernel writing: roll out, evaluate, reward, update; one loop on Hugging Face Accelerate.

Each step picks --tasks-per-step tasks (level 1 and level 2 taking turns, shuffled by the seed and the
step), rolls out --n-trajectories x --turns on each with generate.py's machinery (prompts, parsing,
`run_turns`; with --overlap, no barrier between turns) using the policy being trained, evaluates every
kernel with evaluate.py, scores, discounts and normalises within each task with reward.py, and takes
--updates-per-batch gradient steps. Every turn is one training sample: its prompt token ids are the
context, its reply token ids the completion, and only reply tokens are in the loss:

  ratio  r = exp(log pi(token) - log pi_sampling(token))     both at the sampling temperature
  token  l = -min(r A, clip(r, 1 - eps_low, 1 + eps_high) A)  (+ beta * KL(pi || pi_ref), k3 estimator)
  loss   L = sum of l over every reply token / (--max-tokens x number of samples)

Beyond the paper, each off by default (docs/training.md: when to switch them on): --baseline leave-one-out (reward.py);
--filter-zero-std drops groups whose advantages are all 0 before the update; --mask-truncated gives replies cut
at --max-tokens no loss; --is-correction takes the ratio against the trainer's own log-probs and weights each
token by pi_trainer / pi_sampler, truncated or masked at --is-cap (TRL's vllm_importance_sampling_correction).
With sampling log-probs the step's metrics carry the sampler/trainer mismatch (mismatch/*) whatever the flag.

Paper defaults (Kevin, arXiv 2507.11948): 8 tasks x 16 trajectories x 4 turns = 512 samples a step,
temperature 0.9, clip-higher with eps_low 0.2 and eps_high 0.28, no KL, lr 2e-6 constant after a
linear warm-up over 3% of the gradient steps, grad norm clipped at 0.05, 2 gradient steps per batch,
a constant length normaliser (Dr. GRPO), rewards 0.3 * correct + speedup, gamma 0.4 discounted sum,
advantages normalised over all of a task's turn-samples.

Run:
  python train.py                                   # the warm-started policy learning: minutes, GPU if any
  python train.py --model tiny                      # the bare random tiny model: a smoke test of the whole loop
  accelerate launch --config_file configs/ddp.yaml train.py --model Qwen/Qwen2.5-7B-Instruct
  accelerate launch --config_file configs/ddp.yaml --num_processes 2 train.py    # also on a CPU (gloo)
  python train.py --rollouts rewarded.jsonl          # offline: update from trajectories written before
  python train.py --resume                           # go on from the last checkpoint in --out
  python train.py --overwrite                        # start afresh where a previous run left its output

With no --model, the policy is the small one warm-started on the kernel library (warm_policy.policy: shipped for the
CPU, else made once at the first run and cached in .cache/warm_start), trained on every task of the library (CUDA
kernels on a GPU, C++ on the CPU) with 4 trajectories x 2 turns a task for 8 steps (16 for C++) at lr 5e-5: a run of
minutes whose score and share correct rise. The paper's sizes are the defaults for a real model on a GPU. For
--model tiny (a smoke test: a random model writes junk, every score is 0), or without a GPU, they shrink to 2 tasks
x 2 trajectories x 2 turns, 128-token replies, 3 steps; with a GPU on the train split of tasks/, without one on the
two CPU-sized tasks in tests/tasks. Output: one JSON line of metrics per step (--log), its learning curve beside it
(the same name, .png), checkpoints in --out/checkpoints, the final model in --out/final, and a table
of the reward curve at the end, each turn's score in a column. An --out that holds a previous run is refused
unless --resume continues it (from the latest checkpoint the metrics log reaches, the log cut back to it; a finished
run is said to be so, and left as it is) or --overwrite deletes it; one run at a time may hold it (a lock). A Ctrl-C
says in one line what is kept and how to go on (exit status 130). Under accelerate launch, bad input is said once, by
the first process; the launcher then reports the failed processes itself (`accelerate launch -q`: without its
traceback).

Simplifications, said out loud:
- Old policy = sampling policy: both gradient steps of a batch take the ratio against the log-probs
  recorded while sampling (the first step is on-policy, the second off-policy by one update). A file
  without log-probs (--rollouts) uses the policy's own before the first update, as --is-correction does.
- Each rank rolls out and evaluates whole tasks (--tasks-per-step must divide by the number of
  processes), so advantages, normalised within a task, need nothing from other ranks.
- Every sample is forwarded, also those with advantage 0 (they add no gradient but do add entropy), unless
  --filter-zero-std; then the loss's normaliser counts the samples kept, as if the batch had been refilled.
- The reference model (--beta > 0) is a full, unsharded copy on every rank.
- --backend vllm keeps one vLLM engine beside the policy in every process (tensor parallel size 1); it
  sleeps (on a GPU) whenever it is not generating. --backend vllm-server generates through a vLLM server
  started apart. Either takes the policy's weights after every update (LoRA merged into them), and the
  engine's greedy reply and log-probs of a fixed prompt are checked against the policy's on every rank.
"""

from __future__ import annotations

from kevin.startup import freeze_at_exit, quiet_ctrl_c_while_starting, started

if __name__ == "__main__":
    quiet_ctrl_c_while_starting("before training")
    freeze_at_exit()

import argparse
import contextlib
import io
import json
import math
import os
import random
import re
import shutil
import sys
import time
from collections import Counter
from dataclasses import asdict, dataclass, field, replace
from datetime import timedelta
from pathlib import Path
from typing import Literal

from kevin.dependencies import require

require("torch", "accelerate", "transformers", "tqdm")

import torch
from accelerate import Accelerator, PartialState
from accelerate.utils import gather_object, set_seed
from tqdm import tqdm
from transformers import AutoModelForCausalLM, AutoTokenizer

from kevin import rewards
from kevin import learning_curves
from kevin.batching import Sample, collate, put_logprob_head, reply_logprobs
from kevin.backends import HFBackend, check_model, check_vllm
from kevin.config_flags import AT_LEAST_1, NOT_NEGATIVE, POSITIVE, add_config_flags, check, config_from
from kevin.evaluator import EvalConfig
from kevin.rollout_config import RolloutConfig
from kevin.rollouts import run_turns
from kevin.tasks import Task, load_tasks
from kevin.tiny_model import build_tiny_model
from kevin.training import (UpdateMemory, checkpoint_step, clear_previous_run, end_after_the_first, first_process,
                            is_sharded, load_policy, lock_output_dir, logged_steps, make_accelerator, memory_line,
                            parameter_checksum, policy_for_generation, previous_run, resume_checkpoint)
from kevin.vllm_sync import ColocatedEngine, ServedEngine, policy_weights, served_model, sync_error

REPO = Path(__file__).resolve().parent
# Sizes: the paper's for a real model on a GPU (its rollout sizes are the shared rollout settings' defaults); a smoke
# test of minutes for the tiny model or on a CPU.
PAPER_SIZES = {"tasks_per_step": 8, "steps": 40, "lr": 2e-6,
               **{name: getattr(RolloutConfig, name) for name in ("n_trajectories", "turns", "max_tokens")}}
DEMO_SIZES = {"tasks_per_step": 2, "n_trajectories": 2, "turns": 2, "max_tokens": 128, "steps": 3, "lr": 2e-6}
# The default run (--model warm-start): the warm-started policy on every task of its library, 4 x 2 a task for 8 steps
# (16 for C++ kernels: on two CPU cores, where only correctness pays, the score rose over 8 steps in some seeds and
# fell back in others, over 16 in each of three; docs/training.md). lr 5e-5, far above the paper's 2e-6 for a 32B
# model: the policy has ~0.7M parameters and few steps to move, and much higher blurs the kernels it memorised.
# fp32: bf16 rounding is as large as the updates of so small a model. max_tokens: its longest library reply + 32,
# from the policy's warm_start.json.
WARM_START_SIZES = {"n_trajectories": 4, "turns": 2, "steps": 8, "lr": 5e-5, "bf16": False}
WARM_START_CPU_STEPS = 16
# Place: CUDA kernels on the shipped tasks with a GPU; C++ kernels on the two CPU-sized test tasks without.
GPU_PLACE = {"tasks": "train", "device": "cuda", "bf16": True}
CPU_PLACE = {"tasks": str(REPO / "tests" / "tasks"), "device": "cpu", "bf16": False}


# ---------------------------------------------------------------- the loss: small pure functions
def clipped_surrogate(logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor,
                      eps_low: float, eps_high: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token loss -min(r A, clip(r, 1 - eps_low, 1 + eps_high) A), and where the clip binds (no gradient).

    Clip-higher: eps_high > eps_low leaves more room to raise unlikely tokens of good replies."""
    ratio = torch.exp(logprobs - old_logprobs)
    loss = -torch.minimum(ratio * advantages, ratio.clamp(1 - eps_low, 1 + eps_high) * advantages)
    clipped = ((ratio > 1 + eps_high) & (advantages > 0)) | ((ratio < 1 - eps_low) & (advantages < 0))
    return loss, clipped


def kl_k3(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """Per-token estimate of KL(pi || pi_ref) that is never negative: exp(d) - d - 1 with d = ref - policy."""
    d = ref_logprobs - logprobs
    return torch.exp(d) - d - 1


def importance_weights(trainer: torch.Tensor, sampler: torch.Tensor, mask: torch.Tensor, mode: str,
                       cap: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token weight pi_trainer / pi_sampler of the sampled tokens, and where it passes `cap`.

    The sampler (vLLM: other kernels, bf16) draws tokens from a slightly different distribution than the
    trainer scores; the weight corrects for it, capped so a rare token cannot blow up the step: per token or one
    per sequence (the product over its tokens), clipped at the cap (truncate) or zeroed beyond it (mask). "off"
    measures per token and clips."""
    log_ratio = torch.where(mask, trainer - sampler, 0.0)
    if mode.startswith("sequence"):
        log_ratio = log_ratio.sum(-1, keepdim=True).expand_as(log_ratio)
    ratio = torch.exp(log_ratio)
    over = ratio > cap
    weights = torch.where(over, 0.0, ratio) if mode.endswith("mask") else ratio.clamp(max=cap)
    return weights, over & mask


def constant_normalised_sum(token_losses: torch.Tensor, mask: torch.Tensor, constant: float) -> torch.Tensor:
    """Dr. GRPO: the sum over masked tokens divided by a constant, so no reply's tokens weigh more for being short."""
    return torch.where(mask, token_losses, 0.0).sum() / constant


def learning_rate(update: int, total_updates: int, peak: float, warmup_ratio: float) -> float:
    """Linear warm-up over ceil(warmup_ratio * total) updates (0-based `update`), then constant."""
    warmup = math.ceil(warmup_ratio * total_updates)
    return peak * min(1.0, (update + 1) / warmup) if warmup else peak


# ---------------------------------------------------------------- samples and batches
def turn_samples(trajectories: list[dict]) -> list[Sample]:
    """One sample per turn of rewarded trajectories that has an advantage (reward.add_rewards leaves None on turns
    not evaluated and on those left out of the loss)."""
    samples = []
    for record in trajectories:
        for turn in record["turns"]:
            if turn["advantage"] is None:
                continue
            prompt_ids, reply = turn["prompt"].get("token_ids"), turn["reply"]
            if not prompt_ids or reply.get("token_ids") is None:
                raise ValueError(f"task {record['task']} turn {turn['turn']}: no token ids (the openai backend "
                                 "records none; generate with --backend hf or vllm)")
            logprobs = reply.get("logprobs")
            if logprobs is not None and len(logprobs) != len(reply["token_ids"]):
                raise ValueError(f"task {record['task']} turn {turn['turn']}: {len(logprobs)} log-probs for "
                                 f"{len(reply['token_ids'])} reply tokens")
            samples.append(Sample(prompt_ids, reply["token_ids"], logprobs, float(turn["advantage"])))
    return samples


def truncation(args: TrainConfig):
    """With --mask-truncated, what names a turn whose reply reached --max-tokens: a reply cut off is no sample of
    what the policy would have written, and its score says nothing of its tokens (DAPO's overlong filtering); it is
    left out of the loss and of its group's baseline (reward.add_rewards' `left_out`), kept in the normaliser."""
    if args.mask_truncated:
        return lambda turn: len(turn["reply"]["token_ids"]) >= args.max_tokens
    return None


def scored_turns(trajectories: list[dict]) -> int:
    """The turn-samples that count in the loss's normaliser: all but those not evaluated (which have no score)."""
    return sum(turn["score"] is not None for record in trajectories for turn in record["turns"])


def micro_batches(samples: list[Sample], size: int, count: int) -> list[list[Sample]]:
    """Exactly `count` micro-batches of at most `size` samples, similar lengths together (less padding).

    The ones left over are empty: every rank must run the same number of forward and backward passes."""
    ordered = sorted(samples, key=lambda s: len(s.prompt_ids) + len(s.reply_ids))
    chunks = [ordered[i:i + size] for i in range(0, len(ordered), size)]
    if len(chunks) > count:
        raise ValueError(f"{len(samples)} samples do not fit in {count} micro-batches of {size}")
    return chunks + [[] for _ in range(count - len(chunks))]


def grpo_loss(model, batch: dict[str, torch.Tensor], temperature: float, eps_low: float, eps_high: float,
              constant: float, beta: float = 0.0, ref_model=None, is_correction: str = "off", is_cap: float = 3.0):
    """(loss, token statistics, the trainer's log-probs before the update) for one micro-batch.

    The trainer's are batch["trainer_logprobs"] where an earlier pass recorded them, else the policy's own,
    detached. The old log-probs of the ratio are the sampler's where recorded (the paper's), the trainer's
    elsewhere and with an --is-correction, which then weights each token's loss (importance_weights). The
    mismatch statistics cover the tokens with sampling log-probs. The models' output layers are LogprobHeads
    (batching.put_logprob_head): no micro-batch's whole logits are ever built."""
    logprobs, entropy = reply_logprobs(model, batch, temperature)
    mask = batch["reply_mask"]
    trainer = torch.where(batch["trainer_logprobs"].isnan(), logprobs.detach(), batch["trainer_logprobs"])
    sampled = mask & ~batch["old_logprobs"].isnan()
    sampler = torch.where(sampled, batch["old_logprobs"], trainer)
    old = sampler if is_correction == "off" else trainer
    token_loss, clipped = clipped_surrogate(logprobs, old, batch["advantages"][:, None], eps_low, eps_high)
    weights, over_cap = importance_weights(trainer, sampler, mask, is_correction, is_cap)
    if is_correction != "off":
        token_loss = token_loss * weights
    stats = {"sampled": sampled.sum(), "logprob_diff": torch.where(sampled, (trainer - sampler).abs(), 0.0).sum(),
             "mismatch_kl": torch.where(sampled, kl_k3(sampler, trainer), 0.0).sum(),
             "over_cap": (over_cap & sampled).sum()}
    if beta > 0:
        with torch.no_grad():
            ref, _ = reply_logprobs(ref_model, batch, temperature)
        kl = kl_k3(logprobs, ref)
        token_loss = token_loss + beta * kl
        stats["kl"] = torch.where(mask, kl.detach(), 0.0).sum()
    loss = constant_normalised_sum(token_loss, mask, constant)
    with torch.no_grad():  # sums under the mask, not of x[mask]: that waits for the GPU to learn its size
        stats.update(tokens=mask.sum(), clipped=(clipped & mask).sum(), entropy=torch.where(mask, entropy, 0.0).sum())
    return loss, stats, trainer


def idle_loss(model, pad_id: int, device) -> torch.Tensor:
    """A zero loss through the whole model, for a rank with no samples left: it still has to join the
    others' gradient all-reduce (DDP) or parameter gathers (FSDP, ZeRO-3)."""
    logits = model(input_ids=torch.tensor([[pad_id]], device=device), logits_to_keep=1, use_cache=False).logits
    return logits.sum() * 0.0


# ---------------------------------------------------------------- what to watch
def first_word(text: str) -> str:
    """The reply's first word past an opening <think> tag and punctuation ('' if none): Kevin's "Okay"."""
    match = re.search(r"\w+", text.replace("<think>", "", 1))
    return match.group(0) if match else ""


def repeated_ngram_share(ids: list[int], n: int = 4) -> float:
    """Share of a reply's n-grams that already occurred earlier in it (0: no repetition, near 1: a loop)."""
    grams = [tuple(ids[i:i + n]) for i in range(len(ids) - n + 1)]
    return 1 - len(set(grams)) / len(grams) if grams else 0.0


def rollout_rows(trajectories: list[dict]) -> list[dict]:
    """One small row per turn-sample: what the step's metrics are computed from, after gathering ranks."""
    rows = []
    for record in trajectories:
        for number, turn in enumerate(record["turns"], 1):  # by position: files of any age read alike
            result, ids = turn["eval"], turn["reply"]["token_ids"] or []
            rows.append({"task": record["task"], "turn": number, "score": turn["score"],
                         "return": turn["return"], "correct": bool(result["correct"]),
                         "compiled": bool(result["compiled"]),
                         "speedup": float(result["speedup"]) if result["correct"] else 0.0,
                         "reply_tokens": len(ids), "first_word": first_word(turn["reply"]["text"]),
                         "repeated_4grams": repeated_ngram_share(ids)})
    return rows


def rollout_metrics(rows: list[dict], usual_word: str, max_tokens: int) -> dict[str, float]:
    """Reward, correctness and speedup (0 when incorrect, as in the paper's avg@k) overall and per turn;
    the share of tasks whose returns are all equal (no signal); reply length; the junk detectors."""
    def mean(values) -> float:
        values = list(values)
        return sum(values) / len(values) if values else 0.0

    everything, rows = rows, [r for r in rows if r["score"] is not None]  # not evaluated: counted, not averaged
    metrics = {"reward/score": mean(r["score"] for r in rows), "reward/correct": mean(r["correct"] for r in rows),
               "reward/compiled": mean(r["compiled"] for r in rows), "reward/speedup": mean(r["speedup"] for r in rows)}
    for turn in sorted({r["turn"] for r in rows}):
        at = [r for r in rows if r["turn"] == turn]
        metrics[f"reward/score_turn{turn}"] = mean(r["score"] for r in at)
        metrics[f"reward/correct_turn{turn}"] = mean(r["correct"] for r in at)
        metrics[f"reward/speedup_turn{turn}"] = mean(r["speedup"] for r in at)
    returns: dict[str, list[float]] = {}
    for r in rows:
        returns.setdefault(r["task"], []).append(r["return"])
    metrics["reward/zero_std_tasks"] = mean(max(v) == min(v) for v in returns.values())
    metrics["reply/tokens"] = mean(r["reply_tokens"] for r in rows)
    metrics["reply/truncated"] = mean(r["reply_tokens"] >= max_tokens for r in rows)
    metrics["junk/other_first_word"] = mean(r["first_word"] != usual_word for r in rows)
    metrics["junk/repeated_4grams"] = mean(r["repeated_4grams"] for r in rows)
    metrics["reward/not_evaluated"] = len(everything) - len(rows)
    return metrics


# ---------------------------------------------------------------- tasks
def pick_tasks(task_ids: list[str], count: int, seed: int, step: int) -> list[str]:
    """`count` distinct tasks, levels (the id's folder) taking turns so easy and hard mix in every batch."""
    rng = random.Random(f"{seed}/{step}")
    levels: dict[str, list[str]] = {}
    for task_id in task_ids:
        levels.setdefault(task_id.split("/")[0], []).append(task_id)
    queues = [rng.sample(ids, len(ids)) for _, ids in sorted(levels.items())]
    picked: list[str] = []
    while len(picked) < count:
        for queue in queues:
            if queue and len(picked) < count:
                picked.append(queue.pop())
    return picked


def offline_steps(trajectories: list[dict], tasks_per_step: int) -> list[list[list[dict]]]:
    """A file's trajectories as steps of `tasks_per_step` tasks (in order of first appearance), each task
    a list of its trajectories."""
    by_task: dict[str, list[dict]] = {}
    for record in trajectories:
        by_task.setdefault(record["task"], []).append(record)
    tasks = list(by_task.values())
    return [tasks[i:i + tasks_per_step] for i in range(0, len(tasks), tasks_per_step)]


# ---------------------------------------------------------------- generation with the policy
def push_policy(run, when: str) -> list[dict] | None:
    """The policy's weights into the vLLM engine (every rank takes part: gathers are collectives), then each
    rank's engine checked against the policy on a fixed prompt and one line printed; None with the hf backend."""
    if run.backend is None:
        return None
    run.backend.load_weights(policy_weights(run.accelerator, run.model))
    run.accelerator.wait_for_everyone()  # a served engine: no rank generates before it has the new weights
    with policy_for_generation(run.accelerator, run.model) as policy:
        checks = gather_object([sync_error(run.backend, policy, run.tokenizer)])
    run.accelerator.print(f"weights pushed {when}: " + "; ".join(
        f"rank {rank} greedy {'same' if c['greedy_match'] else 'DIFFERENT'}, max |log-prob diff| "
        f"{c['max_logprob_diff']:.1e}" for rank, c in enumerate(checks)))
    return checks


# ---------------------------------------------------------------- checks before anything loads
def check_inputs(args: TrainConfig) -> None:
    """One-line errors before anything is loaded. Then the output folder is locked (by the first process, for the
    run's life), so that what it holds is this run's to judge: a fresh run into the output of a previous one is
    refused (the old checkpoints would outlive the new metrics, and a later --resume would mix the two runs), and so
    is a --resume with no checkpoint to go on from."""
    output_dir, log = Path(args.out), Path(args.log)
    if output_dir.is_file():
        raise SystemExit(f"error: --out {args.out} is a file, not a folder")
    if args.model != "tiny":  # warm-start is a folder by now
        check_model(args.model)
    if args.backend == "vllm":
        check_vllm()
    if (args.backend == "vllm-server") != (args.base_url is not None):
        raise SystemExit("error: --base-url goes with --backend vllm-server, and it needs one")
    if args.base_url is not None:
        served_model(args.base_url)  # answers, before anything is loaded
    if first_process():
        lock_output_dir(output_dir)
    left = previous_run(output_dir, log)
    if left and not (args.resume or args.overwrite):
        raise SystemExit(f"error: {', '.join(map(str, left))} from a previous run: pass --resume to continue it, "
                         "--overwrite to delete it and start afresh, or another --out")
    if args.resume and resume_checkpoint(output_dir, log) is None:
        raise SystemExit(f"error: --resume: no checkpoint in {output_dir / 'checkpoints'} that {log} reaches; pass "
                         "--overwrite to start afresh" if left else
                         f"error: --resume: nothing to resume in {output_dir} (no checkpoint); run without --resume")


# ---------------------------------------------------------------- config
@dataclass
class TrainConfig(RolloutConfig):
    """The rollout settings (kevin/rollout_config.py), their sizes and place left to the machine, and training's own."""
    model: str = "warm-start"
    """the policy: 'warm-start', the small policy warm-started on solutions/warm_start/ (shipped for the CPU, else
    made once and cached; warm_policy.policy), trained on every task of its library; 'tiny', the bare random tiny
    model (a smoke test: it writes junk, every score 0); or an HF id or local path"""
    tasks: str | None = None
    """task file, folder or split name of tasks/split.json (default: train with a GPU, tests/tasks without)"""
    n_trajectories: int | None = None
    """parallel trajectories per task (default: 4 for the warm-started policy, 16 (the paper's) for a model of your
    own on a GPU, 2 otherwise)"""
    turns: int | None = None
    """refinement turns per trajectory (default: 4 (the paper's) for a model of your own on a GPU, 2 otherwise)"""
    max_tokens: int | None = None
    """most tokens in a reply, and the loss's length normaliser (default: the warm-started policy's longest library
    reply + 32, 16384 for a model of your own on a GPU, 128 otherwise)"""
    gpu_memory_utilization: float = 0.3  # the engine shares the GPU with the policy being trained
    # model
    lora_rank: int = 0
    """train LoRA adapters of this rank (alpha = 2 x rank) on every linear layer instead of all weights; 0: full
    fine-tuning (needs peft)"""
    gradient_checkpointing: bool = False
    """recompute activations in backward to save memory"""
    logprob_chunk: int = 4096
    """reply tokens whose logits the loss computes at once, a vocabulary tile of 32,768 at a time (and again in
    backward, their gradient in their place); memory ~ chunk x 32,768 x 2 bytes on a GPU, whatever the reply length
    and vocabulary"""
    bf16: bool | None = None
    """bf16 mixed precision, fp32 master weights (default: on with a GPU, off without)"""
    # tasks and rollouts (defaults: the paper's for a real model on a GPU, a small demo otherwise)
    tasks_per_step: int | None = None
    """tasks per step, split evenly over the processes (default: every task of the warm-started policy's library, 8
    for a model of your own on a GPU, 2 otherwise)"""
    backend: Literal["hf", "vllm", "vllm-server"] = "hf"
    """hf: generate with the policy itself; vllm: a vLLM engine in every process; vllm-server: the vLLM server at
    --base-url; both vLLM ones take the policy's weights after every update"""
    base_url: str | None = None
    """vllm-server: the server's OpenAI-compatible URL, e.g. http://127.0.0.1:8000/v1 (docs/training.md: how to start it);
    the weights go through OUT/weights, which it must be able to read"""
    device: Literal["cuda", "cpu"] | None = None
    """where kernels are evaluated; cpu asks for C++ kernels (default: cuda with a GPU, cpu without)"""
    rollouts: str | None = None
    """offline: update from this trajectory JSONL instead of rolling out, its advantages made with this run's reward
    flags (a file from reward.py must have been rewarded with the same); one step per --tasks-per-step tasks of it"""
    # optimisation
    steps: int | None = None
    """steps (rollout + updates); default 8 for the warm-started policy (16 for its C++ kernels), 40 for a model of
    your own on a GPU, 3 otherwise; offline: all of the file"""
    updates_per_batch: int = 2
    """gradient steps per batch of rollouts"""
    lr: float | None = None
    """peak learning rate (AdamW); default 5e-5 for the warm-started policy, else 2e-6 (the paper's)"""
    warmup_ratio: float = 0.03
    """share of all gradient steps spent warming up linearly"""
    weight_decay: float = 0.0
    """AdamW weight decay"""
    eps_low: float = 0.2
    """ratio clip below 1"""
    eps_high: float = 0.28
    """ratio clip above 1 (clip-higher)"""
    beta: float = 0.0
    """KL coefficient; > 0 loads a frozen reference model"""
    max_grad_norm: float = 0.05
    """clip the gradient's global norm to this"""
    micro_batch_size: int = 4
    """samples per forward/backward pass; gradients accumulate over a rank's whole batch"""
    # beyond the paper: each off by default (docs/training.md: when to switch it on); --baseline is among the reward flags
    filter_zero_std: bool = False
    """drop the groups whose advantages are all 0 before the update (no gradient, only compute); the loss's
    normaliser then counts the samples kept (DAPO's dynamic sampling, no refill)"""
    mask_truncated: bool = False
    """replies that reached --max-tokens get no loss; they still count in the normaliser"""
    is_correction: Literal["off", "token-truncate", "token-mask", "sequence-truncate", "sequence-mask"] = "off"
    """correct the sampler/trainer mismatch (TRL's vllm_importance_sampling_correction): the ratio against the
    trainer's own log-probs, each token's loss weighted by pi_trainer / pi_sampler, per token or per sequence,
    clipped at --is-cap (truncate) or zeroed beyond it (mask)"""
    is_cap: float = 3.0
    """cap of the importance weight (TRL's default)"""
    # run
    out: str = str(REPO / "runs" / "train")
    """checkpoints and the final model go here"""
    log: str | None = None
    """per-step metrics JSONL (default: OUT/metrics.jsonl)"""
    save_every: int = 10
    """checkpoint every this many steps (and after the last)"""
    resume: bool = False
    """go on from the latest checkpoint in --out that the metrics log reaches"""
    overwrite: bool = False
    """delete a previous run's checkpoints, final model and metrics in --out first"""
    report_to: Literal["none", "tensorboard", "wandb", "all"] = "none"
    """also send metrics to these trackers"""
    reward: rewards.RewardConfig = field(default_factory=rewards.RewardConfig)
    """how kernels are scored and turns credited: reward.py's flags (all but --eps), the same defaults"""

    def __post_init__(self):
        """The rollout checks, then training's; None (a size the machine decides) is checked once filled in."""
        super().__post_init__()
        check(self, {**dict.fromkeys(("tasks_per_step", "updates_per_batch", "micro_batch_size", "save_every",
                                      "logprob_chunk", "steps"), AT_LEAST_1),
                     **dict.fromkeys(("eps_low", "eps_high", "beta", "lr", "warmup_ratio", "lora_rank"), NOT_NEGATIVE),
                     "max_grad_norm": POSITIVE, "is_cap": POSITIVE})
        if self.resume and self.overwrite:
            raise ValueError("--resume continues the previous run and --overwrite deletes it: pass one")


def filled_in(config: TrainConfig) -> TrainConfig:
    """The defaults left None, in this one place: the paper's sizes for a real model on a GPU and a smoke test's
    for the tiny model or on a CPU (offline, --steps stays None: all of the file), CUDA or C++ by whether there is
    a GPU, the log in --out. --model warm-start becomes the warm-started policy's folder, for the kernels
    evaluated (made here if neither cached nor shipped), with its own sizes and its library's tasks."""
    on_gpu = torch.cuda.is_available()
    place = GPU_PLACE if on_gpu else CPU_PLACE
    if config.model == "warm-start":
        from kevin import warm_policy

        device = config.device or place["device"]
        model = warm_policy.policy(device)
        report = json.loads((model / "warm_start.json").read_text())
        tasks = config.tasks or str(warm_policy.DEFAULT_TASKS[device])
        sizes = {**WARM_START_SIZES, "tasks_per_step": len(load_tasks(tasks, config.split)),
                 "max_tokens": report["longest_reply_tokens"] + 32}
        if device == "cpu":
            sizes["steps"] = WARM_START_CPU_STEPS
        config = replace(config, model=str(model), tasks=tasks, device=device)
    else:
        sizes = PAPER_SIZES if on_gpu and config.model != "tiny" else DEMO_SIZES
    unset = {name: value for name, value in {**place, **sizes}.items()
             if getattr(config, name) is None and not (name == "steps" and config.rollouts)}
    return replace(config, **unset, log=config.log or str(Path(config.out) / "metrics.jsonl"))


def parse_args(argv=None) -> TrainConfig:
    """TrainConfig from the flags given (reward.py's among them, as its `reward`), filled in for this machine. A bad
    value is a one-line error."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_config_flags(p, TrainConfig, leave_out=("eps",))  # eps, a numerical guard rather than a choice, is reward.py's
    with contextlib.redirect_stderr(sys.stderr if first_process() else io.StringIO()):  # argparse's error, once
        args = p.parse_args(argv)
    try:
        return filled_in(config_from(args, TrainConfig))
    except ValueError as e:  # a size filled in for this machine
        raise SystemExit(f"error: {e}") from None


# ---------------------------------------------------------------- setup
@dataclass
class Run:
    """What setup builds once and every step uses."""
    accelerator: Accelerator
    model: torch.nn.Module  # the policy, as accelerate prepared it
    optimizer: torch.optim.Optimizer
    tokenizer: object
    pad_id: int
    ref_model: torch.nn.Module | None  # frozen reference for the KL term (--beta > 0 only)
    backend: ColocatedEngine | ServedEngine | None  # None: generate with the policy itself
    eval_config: EvalConfig
    accumulation: int  # micro-batches per update, the same on every rank
    steps: int
    plan: list[list[list[dict]]] | None  # offline: each step's tasks, each a list of its trajectories
    tasks: dict[str, Task] | None  # online: the tasks to pick from, by id
    out: Path
    log_path: Path
    first_words: Counter = field(default_factory=Counter)  # of every reply so far: the junk signal's reference


def offline_plan(args: TrainConfig, world: int) -> tuple[list[list[list[dict]]], int]:
    """The --rollouts file cut into steps, and the most turn-samples one rank gets in a step. Its advantages are
    made here with this run's reward flags, unless reward.py made them: then with the same settings, or the run is
    refused (flags that changed nothing would be worse)."""
    trajectories = rewards.load_trajectories(args.rollouts)
    wanted = asdict(args.reward)
    made = [record.get("rewarded_with") for record in trajectories]
    if all(made):
        differ = sorted({f"--{key.replace('_', '-')} {m[key]}" for m in made for key in wanted
                         if key != "eps" and m.get(key) != wanted[key]})  # eps: reward.py's flag alone
        if differ:
            raise SystemExit(f"error: --rollouts {args.rollouts}: its advantages were made with {', '.join(differ)}, "
                             "which this run's flags do not say: give train.py those flags, or reward.py's input "
                             "(train.py then makes the advantages itself)")
    trajectories = rewards.add_rewards(trajectories, args.reward, truncation(args))  # the same, but for masking
    try:
        turn_samples(trajectories)
    except ValueError as error:
        raise SystemExit(f"error: --rollouts {args.rollouts}: {error}") from None
    plan = offline_steps(trajectories, args.tasks_per_step)[:args.steps]
    if not plan:
        raise SystemExit(f"error: --rollouts {args.rollouts}: no trajectories")
    per_rank = max(sum(len(t["turns"]) for group in step[r::world] for t in group)
                   for step in plan for r in range(world))
    return plan, per_rank


def online_tasks(args: TrainConfig, world: int) -> tuple[dict[str, Task], int]:
    """The tasks to roll out on, and the turn-samples one rank rolls out in a step."""
    tasks = {task.id: task for task in load_tasks(args.tasks, args.split)}
    if args.tasks_per_step % world:
        raise SystemExit(f"error: --tasks-per-step {args.tasks_per_step} does not divide over {world} processes")
    if args.tasks_per_step > len(tasks):
        raise SystemExit(f"error: --tasks-per-step {args.tasks_per_step} but --tasks {args.tasks} has "
                         f"{len(tasks)} tasks")
    return tasks, args.tasks_per_step // world * args.n_trajectories * args.turns


def setup(args: TrainConfig) -> Run:
    """Processes, the step plan, the policy and its optimizer, the reference model, the vLLM engine."""
    on_gpu = torch.cuda.is_available()
    # A rank waits at the next collective while the slowest rank's kernels are being evaluated.
    state = PartialState(cpu=not on_gpu, timeout=timedelta(hours=3))
    world = state.num_processes
    # What each step trains on decides how many micro-batches an update takes on every rank.
    plan, tasks = None, None
    if args.rollouts:
        plan, per_rank = offline_plan(args, world)
    else:
        tasks, per_rank = online_tasks(args, world)
    steps = len(plan) if plan else args.steps
    if args.resume:
        stop_if_finished(args, steps, state.is_main_process)
    accumulation = max(1, math.ceil(per_rank / args.micro_batch_size))
    accelerator = make_accelerator(args, accumulation, on_gpu)
    set_seed(args.seed)

    model_path = args.model
    if model_path == "tiny":
        with accelerator.main_process_first():
            model_path = build_tiny_model()
    tokenizer = AutoTokenizer.from_pretrained(model_path, padding_side="left")
    model, optimizer = load_policy(args, accelerator, model_path)
    ref_model = None
    if args.beta > 0:
        ref_model = put_logprob_head(AutoModelForCausalLM.from_pretrained(
            model_path, dtype=torch.float32, device_map=accelerator.device), args.logprob_chunk).eval()
        ref_model.requires_grad_(False)
    backend, dtype = None, "bfloat16" if args.bf16 else "float32"  # the engine's: the policy's compute dtype
    if args.backend == "vllm":
        backend = ColocatedEngine(model_path, args.temperature, args.max_tokens, args.gpu_memory_utilization, args.seed,
                                  dtype)
    elif args.backend == "vllm-server":
        backend = ServedEngine(args.base_url, tokenizer, args.temperature, args.max_tokens, dtype,
                               Path(args.out) / "weights", accelerator.is_main_process)
    eval_config = EvalConfig(device=args.device, ray=args.ray,  # on a cluster, every rank shares its evaluators
                             gpus=[state.local_process_index] if args.device == "cuda" and not args.ray else None,
                             compile_workers=max(1, len(os.sched_getaffinity(0)) // world), progress=False,
                             rules=args.rules)
    return Run(accelerator, model, optimizer, tokenizer,
               tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id,
               ref_model, backend, eval_config, accumulation, steps, plan, tasks,
               Path(args.out), Path(args.log))


def stop_if_finished(args: TrainConfig, steps: int, main_process: bool) -> None:
    """--resume of a run that has done its steps and saved its final model: one line, nothing touched, exit status
    0 (a script that resumes until done may call it again)."""
    output_dir = Path(args.out)
    done = checkpoint_step(resume_checkpoint(output_dir, Path(args.log)))
    if done >= steps and (output_dir / "final").exists():
        if main_process:
            more = "" if args.rollouts else f"; --steps above {done} trains on from it"
            print(f"nothing to resume: {output_dir} holds a run finished after step {done}, its model in "
                  f"{output_dir / 'final'}{more}")
        raise SystemExit(0)


def resume(args: TrainConfig, run: Run) -> int:
    """The steps done (and run.first_words) from the last checkpoint with --resume, else 0; the metrics log is cut
    back to the steps done. A fresh run's log is made by its first step's line: a run stopped before it leaves
    nothing that a re-run would take for a previous run."""
    start = 0
    if args.overwrite and run.accelerator.is_main_process:
        clear_previous_run(run.out, run.log_path)
    run.accelerator.wait_for_everyone()
    if args.resume:
        checkpoint = resume_checkpoint(run.out, run.log_path)
        run.accelerator.load_state(str(checkpoint))
        saved = json.loads((checkpoint / "trainer_state.json").read_text())
        start, run.first_words = saved["step"], Counter(saved["first_words"])
        run.accelerator.print(f"resumed from {checkpoint} after step {start}")
    push_policy(run, "at the start")  # a server may hold other weights; a resumed policy is not the model loaded
    if run.accelerator.is_main_process:
        run.log_path.parent.mkdir(parents=True, exist_ok=True)
        if args.resume and run.log_path.exists():
            cut_log(run.log_path, start)
    return start


def cut_log(log_path: Path, steps: int) -> None:
    """The metrics log without the lines of steps after `steps`, replaced whole: a stop meanwhile leaves the old."""
    lines = log_path.read_text().splitlines(keepends=True)
    kept = [line for line in lines if json.loads(line)["step"] <= steps]
    if kept != lines:
        partial = log_path.with_name(log_path.name + ".partial")
        partial.write_text("".join(kept))
        partial.replace(log_path)


# ---------------------------------------------------------------- one step
@dataclass
class Rollouts:
    """One step's rollouts as this rank sees them."""
    trajectories: list[dict]  # this rank's, rewarded
    samples: int  # turn-samples of the whole step, over all ranks, that count in the normaliser (not evaluated: not)
    tasks: list[str]  # the step's task ids
    seconds: dict[str, float]  # generating, building and checking kernels (generate.run_turns); offline none


def step_rollouts(args: TrainConfig, run: Run, step: int) -> Rollouts:
    """This rank's share of the step: its tasks rolled out with the policy and rewarded, or its part of the file."""
    world, rank = run.accelerator.num_processes, run.accelerator.process_index
    if run.plan is not None:
        groups = run.plan[step]
        return Rollouts([t for group in groups[rank::world] for t in group],
                        scored_turns([t for group in groups for t in group]), [group[0]["task"] for group in groups], {})
    picked = pick_tasks(list(run.tasks), args.tasks_per_step, args.seed, step)
    my_tasks = [run.tasks[task_id] for task_id in picked[rank::world]]
    records = [{"task": task.id, "trajectory": k, "turns": []} for task in my_tasks for k in range(args.n_trajectories)]
    record_tasks = [task for task in my_tasks for _ in range(args.n_trajectories)]
    with policy_for_generation(run.accelerator, run.model) as policy:
        generator = run.backend or HFBackend(policy, args.temperature, args.max_tokens, tokenizer=run.tokenizer,
                                             synced_gpus=is_sharded(run.accelerator) and world > 1)
        seconds = run_turns(records, record_tasks, generator, run.eval_config, turns=args.turns,
                            seed=f"{args.seed}/{step}", device=args.device, context_budget=args.context_budget,
                            overlap=args.overlap)
    rewarded = rewards.add_rewards(records, args.reward, truncation(args))
    return Rollouts(rewarded, sum(gather_object([scored_turns(rewarded)])), picked, seconds)


LOSS_TOTALS = ("loss", "tokens", "clipped", "entropy", "kl")  # summed over every update's micro-batches
MISMATCH_TOTALS = ("sampled", "logprob_diff", "mismatch_kl", "over_cap")  # the first update's: the sampling policy
STEP_TOTALS = (*LOSS_TOTALS, *MISMATCH_TOTALS, "dropped")  # what update() sums, in this order


@dataclass
class Update:
    """What one step's gradient steps did on this rank."""
    totals: torch.Tensor  # STEP_TOTALS
    grad_norms: list[float]  # one per gradient step
    lr: float  # the last gradient step's
    memory: dict[str, float]  # the GPU's, by kind (kevin/training.py: UpdateMemory); empty on the CPU


def samples_to_train_on(args: TrainConfig, rollouts: Rollouts) -> tuple[list[Sample], int, int]:
    """(this rank's turn-samples, those of the whole step that count in the loss's normaliser, the samples this
    rank dropped): --filter-zero-std drops groups without advantage, from the normaliser as well."""
    trajectories, counted, dropped = rollouts.trajectories, rollouts.samples, 0
    if args.filter_zero_std:
        trajectories = rewards.drop_zero_advantage_groups(trajectories, args.reward.group_by)
        dropped = sum(len(r["turns"]) for r in rollouts.trajectories) - sum(len(r["turns"]) for r in trajectories)
        counted -= sum(gather_object([dropped]))
    return turn_samples(trajectories), counted, dropped


def update(args: TrainConfig, run: Run, step: int, rollouts: Rollouts) -> Update:
    """--updates-per-batch gradient steps on the rollouts."""
    accelerator, model = run.accelerator, run.model
    memory = UpdateMemory(accelerator.device)
    samples, counted, dropped = samples_to_train_on(args, rollouts)
    # DDP averages over ranks: the global sum / (max tokens x samples)
    constant = args.max_tokens * max(counted, 1) / accelerator.num_processes
    chunks = micro_batches(samples, args.micro_batch_size, run.accumulation)
    totals = torch.zeros(len(STEP_TOTALS), device=accelerator.device)
    totals[-1] = dropped
    losses, mismatch = slice(0, len(LOSS_TOTALS)), slice(len(LOSS_TOTALS), len(STEP_TOTALS) - 1)
    grad_norms = []
    for update_index in range(args.updates_per_batch):
        lr = learning_rate(step * args.updates_per_batch + update_index, run.steps * args.updates_per_batch, args.lr,
                           args.warmup_ratio)
        for group in run.optimizer.param_groups:
            group["lr"] = lr
        for chunk in chunks:
            with accelerator.accumulate(model):
                if chunk:
                    loss, stats = micro_batch_loss(args, run, chunk, constant)
                    totals[losses] += stats[losses]
                    if update_index == 0:  # later updates score with a policy that has moved
                        totals[mismatch] += stats[mismatch]
                else:
                    loss = idle_loss(model, run.pad_id, accelerator.device)
                # accelerate divides by the accumulation steps; the loss is already normalised
                accelerator.backward(loss * run.accumulation)
                if accelerator.sync_gradients:
                    norm = accelerator.clip_grad_norm_(model.parameters(), args.max_grad_norm)
                    norm = norm.full_tensor() if hasattr(norm, "full_tensor") else norm  # FSDP 2: a DTensor
                    grad_norms.append(float(norm) if norm is not None else float("nan"))
                    memory.gradients_done(model)
                run.optimizer.step()
                run.optimizer.zero_grad()
    return Update(totals, grad_norms, lr, memory.report(model, run.optimizer))


def micro_batch_loss(args: TrainConfig, run: Run, chunk: list[Sample], constant: float):
    """(loss, its statistics: STEP_TOTALS but the last, in that order) of one micro-batch. Samples without sampling
    log-probs, and with --is-correction all, keep the trainer's log-probs of this first pass, so later updates
    see the pre-update policy as old."""
    device = run.accelerator.device
    # from pinned memory without waiting: a copy from pageable memory first waits for the GPU to finish its queue
    batch = {k: v.pin_memory().to(device, non_blocking=True) if device.type == "cuda" else v.to(device)
             for k, v in collate(chunk, run.pad_id).items()}
    loss, stats, trainer = grpo_loss(run.model, batch, args.temperature, args.eps_low, args.eps_high, constant,
                                     args.beta, run.ref_model, args.is_correction, args.is_cap)
    keep = [s.trainer_logprobs is None and (args.is_correction != "off" or s.old_logprobs is None) for s in chunk]
    if any(keep):  # copying them to the host waits for the GPU
        for sample, row, mask, k in zip(chunk, trainer.tolist(), batch["reply_mask"].tolist(), keep):
            if k:
                sample.trainer_logprobs = [lp for lp, m in zip(row, mask) if m]
    stats.update(loss=loss.detach(), kl=stats.get("kl", torch.zeros((), device=loss.device)))
    return loss, torch.stack([stats[name] for name in STEP_TOTALS[:-1]]).float()


@dataclass
class Step:
    """One step done: what log_step reports."""
    index: int  # from 0
    rollouts: Rollouts
    update: Update
    seconds: dict[str, float]  # the rollout (and of it generating, building, checking), the update, the push
    sync: list[dict] | None  # with vLLM: each rank's engine checked against the policy after the push


def log_step(args: TrainConfig, run: Run, step: Step) -> dict:
    """The step's metrics over all ranks, sent to the trackers and appended to the metrics log (GPU memory:
    the main process's)."""
    accelerator, world = run.accelerator, run.accelerator.num_processes
    rows = gather_object(rollout_rows(step.rollouts.trajectories))
    checksums = gather_object([parameter_checksum(run.model)])
    placement = gather_object([{"device": str(accelerator.device), "eval_gpus": run.eval_config.gpus}])
    totals = dict(zip(STEP_TOTALS, accelerator.reduce(step.update.totals, "sum").tolist()))
    run.first_words.update(r["first_word"] for r in rows)
    usual = run.first_words.most_common(1)[0][0]
    tokens, grad_norms = max(totals["tokens"], 1.0), step.update.grad_norms
    metrics = {**rollout_metrics(rows, usual, args.max_tokens),
               "train/loss": totals["loss"] / (world * args.updates_per_batch),
               "train/clip_ratio": totals["clipped"] / tokens, "train/entropy": totals["entropy"] / tokens,
               "train/kl": totals["kl"] / tokens, "train/grad_norm": sum(grad_norms) / len(grad_norms),
               "train/zero_std_dropped": totals["dropped"] / max(step.rollouts.samples, 1),
               "train/lr": step.update.lr, **{f"time/{name}_s": seconds for name, seconds in step.seconds.items()},
               **step.update.memory}
    if totals["sampled"]:  # sampler against trainer before the update, over the tokens with sampling log-probs
        metrics.update({"mismatch/abs_logprob_diff": totals["logprob_diff"] / totals["sampled"],
                        "mismatch/kl": totals["mismatch_kl"] / totals["sampled"],
                        "mismatch/over_cap": totals["over_cap"] / totals["sampled"]})
    accelerator.log(metrics, step=step.index + 1)
    if accelerator.is_main_process:
        with run.log_path.open("a") as f:
            f.write(json.dumps({"step": step.index + 1, "tasks": step.rollouts.tasks, "samples": step.rollouts.samples,
                                "usual_first_word": usual, **metrics, "checksum_per_rank": checksums,
                                "placement_per_rank": placement,
                                **({"sync_per_rank": step.sync} if step.sync else {})}) + "\n")
    return metrics


def save_checkpoint(run: Run, steps_done: int) -> None:
    """accelerate's state, with the step count and the first words seen: what --resume reads back."""
    checkpoint = run.out / "checkpoints" / f"step_{steps_done:06d}"
    run.accelerator.save_state(str(checkpoint))
    if run.accelerator.is_main_process:
        (checkpoint / "trainer_state.json").write_text(
            json.dumps({"step": steps_done, "first_words": dict(run.first_words)}))


def save_final(run: Run) -> None:
    """The trained model and its tokenizer in OUT/final, written beside it and renamed into place once whole
    (a run stopped while saving leaves no final model for --resume to take for a finished run); the vLLM engine
    shut down."""
    state_dict = run.accelerator.get_state_dict(run.model)
    if run.accelerator.is_main_process:
        final, partial = run.out / "final", run.out / "final.partial"
        shutil.rmtree(partial, ignore_errors=True)
        run.accelerator.unwrap_model(run.model).save_pretrained(partial, state_dict=state_dict)
        run.tokenizer.save_pretrained(partial)
        shutil.rmtree(final, ignore_errors=True)
        partial.replace(final)
    # no rank tears the process group down (a vLLM engine's close, end_training) while another still saves
    run.accelerator.wait_for_everyone()
    if run.backend is not None:
        run.backend.close()


# ---------------------------------------------------------------- the loop
def main(argv=None) -> None:
    """Train, then print the reward curve. A Ctrl-C says in one line what is kept and how to go on from it, and
    exits with status 130."""
    args = parse_args(argv)
    check_inputs(args)
    run = setup(args)
    start = resume(args, run)
    started()  # from here on, a Ctrl-C is main's to report
    try:
        train(args, run, start)
        if run.accelerator.is_main_process:
            report(args, run)
    except KeyboardInterrupt:
        if run.accelerator.is_main_process:
            print(interrupted(args, run), file=sys.stderr)
        raise SystemExit(130) from None


def train(args: TrainConfig, run: Run, start: int) -> None:
    """The steps after `start`, each logged and every --save-every checkpointed, then the final model."""
    run.accelerator.init_trackers("kevin-grpo", config={k: v if isinstance(v, (int, float, str, bool)) else str(v)
                                                         for k, v in asdict(args).items()})
    bar = tqdm(range(start, run.steps), initial=start, total=run.steps, desc="train", unit="step",
               disable=not run.accelerator.is_main_process, file=sys.stderr)
    try:
        for index in bar:
            began = time.perf_counter()
            rollouts = step_rollouts(args, run, index)
            rolled_out = time.perf_counter()
            done = update(args, run, index, rollouts)
            updated = time.perf_counter()
            sync = push_policy(run, f"after step {index + 1}")
            seconds = {"rollout": rolled_out - began, **rollouts.seconds, "update": updated - rolled_out,
                       "push": time.perf_counter() - updated}
            metrics = log_step(args, run, Step(index, rollouts, done, seconds, sync))
            if done.memory and index == start:
                run.accelerator.print(memory_line(done.memory))
            bar.set_postfix(score=f"{metrics['reward/score']:.3f}", correct=f"{metrics['reward/correct']:.0%}")
            if (index + 1) % args.save_every == 0 or index + 1 == run.steps:
                save_checkpoint(run, index + 1)
    finally:
        bar.close()  # its line ended before anything else is printed
    save_final(run)
    run.accelerator.end_training()


def report(args: TrainConfig, run: Run) -> None:
    """The run's reward curve as a table and beside the metrics log as a plot, and where everything is."""
    logged = [json.loads(line) for line in run.log_path.read_text().splitlines()]
    print(summary_table(logged))
    model = Path(args.model)  # named inside the repository where it lies there
    name = model.relative_to(REPO) if model.is_absolute() and model.is_relative_to(REPO) else model.name
    curve = learning_curves.plot_run(logged, run.log_path.with_suffix(".png"), f"GRPO from {name}")
    print(f"metrics: {run.log_path}   curve: {curve}   model: {run.out / 'final'}")


def interrupted(args: TrainConfig, run: Run) -> str:
    """What a stopped run keeps (the steps logged; the model and optimizer at the latest checkpoint) and how to go
    on: --resume from that checkpoint, else afresh."""
    logged = logged_steps(run.log_path)
    checkpoint = resume_checkpoint(run.out, run.log_path)
    if checkpoint is not None:
        return (f"interrupted: {logged} of {run.steps} steps logged in {run.log_path}, checkpoint of step "
                f"{checkpoint_step(checkpoint)} in {checkpoint}; re-run with --resume to go on from it")
    if logged:
        return (f"interrupted: {logged} of {run.steps} steps logged in {run.log_path}, none checkpointed yet (every "
                f"--save-every {args.save_every} steps); re-run with --overwrite to start afresh")
    return "interrupted: before the first step ended, nothing kept; re-run to start afresh"


def summary_table(history: list[dict]) -> str:
    """One row per step of the run (its metrics log, with the steps before a resume): the reward curve, each turn's
    mean score (a later turn reads the evaluator's feedback on the earlier ones), and the signals that warn of
    collapse or junk."""
    turns = learning_curves.turns_of(history)
    lines = [f"{'step':>4} {'score':>7} " + "".join(f"{'turn ' + str(t):>7} " for t in turns) +
             f"{'correct':>8} {'speedup':>8} {'zero-std':>9} {'entropy':>8} "
             f"{'other 1st word':>15} {'rep 4-grams':>12} {'grad norm':>10}"]
    for m in history:
        lines.append(f"{m['step']:>4} {m['reward/score']:>7.3f} "
                     + "".join(f"{m[f'reward/score_turn{t}']:>7.3f} " for t in turns) + f"{m['reward/correct']:>8.0%} "
                     f"{m['reward/speedup']:>7.2f}x {m['reward/zero_std_tasks']:>9.0%} {m['train/entropy']:>8.3f} "
                     f"{m['junk/other_first_word']:>15.0%} {m['junk/repeated_4grams']:>12.0%} "
                     f"{m['train/grad_norm']:>10.4f}")
    return "\n".join(lines)


if __name__ == "__main__":
    try:
        main()
    except SystemExit as stop:  # bad input stops every process of a launch alike: the first alone says why
        if first_process() or stop.code in (None, 0, 130):
            raise
        end_after_the_first(1 if isinstance(stop.code, str) else stop.code)
