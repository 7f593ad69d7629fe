"""Turn samples into padded batches and read the policy's log-probs of their replies: the batching that
warm_start.py (supervised) and train.py (GRPO) share, so that both see the same positions and padding
that generation did."""

from dataclasses import dataclass

import torch


@dataclass
class Sample:
    prompt_ids: list[int]
    reply_ids: list[int]
    old_logprobs: list[float] | None  # sampling log-probs of the reply tokens; None: take the policy's
    advantage: float


def token_logprobs(logits: torch.Tensor, tokens: torch.Tensor, temperature: float) -> torch.Tensor:
    """log softmax(logits / temperature) at `tokens`: the log-prob of each token under the sampling distribution."""
    logits = logits.float() / temperature
    return logits.gather(-1, tokens.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(logits, dim=-1)


def collate(samples: list[Sample], pad_id: int) -> dict[str, torch.Tensor]:
    """Left-padded prompt + reply rows; the last `width` positions (the longest reply) are the targets.

    Left padding puts every reply at the end of its row, so logits are needed for the last width + 1
    positions only (`logits_to_keep`: long prompts cost no vocabulary-sized logits). Position ids count
    real tokens only, as in generation, so the policy's log-probs match the sampling ones."""
    width = max(1, max(len(s.reply_ids) for s in samples))
    length = max(len(s.prompt_ids) + len(s.reply_ids) for s in samples)
    input_ids = torch.full((len(samples), length), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((len(samples), length), dtype=torch.long)
    reply_mask = torch.zeros((len(samples), width), dtype=torch.bool)
    old_logprobs = torch.full((len(samples), width), float("nan"))
    for i, s in enumerate(samples):
        ids = s.prompt_ids + s.reply_ids
        input_ids[i, length - len(ids):] = torch.tensor(ids)
        attention_mask[i, length - len(ids):] = 1
        if s.reply_ids:
            reply_mask[i, width - len(s.reply_ids):] = True
            if s.old_logprobs is not None:
                old_logprobs[i, width - len(s.reply_ids):] = torch.tensor(s.old_logprobs)
    return {"input_ids": input_ids, "attention_mask": attention_mask,
            "position_ids": (attention_mask.cumsum(1) - 1).clamp(min=0), "targets": input_ids[:, length - width:],
            "reply_mask": reply_mask, "old_logprobs": old_logprobs,
            "advantages": torch.tensor([s.advantage for s in samples], dtype=torch.float32)}


def reply_logits(model, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Logits that predict each target position (batch, width, vocab)."""
    width = batch["targets"].shape[1]
    out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                position_ids=batch["position_ids"], logits_to_keep=width + 1, use_cache=False)
    return out.logits[:, :-1]
