"""Turn samples into padded batches and read the policy's log-probs of their replies: the batching that
warm_start.py (supervised) and train.py (GRPO) share, so that both see the same positions and padding
that generation did; and the output layer that train.py puts in the policy so that a 16K-token reply's
vocabulary-sized logits never exist at once."""

from dataclasses import dataclass

import torch
from torch.utils.checkpoint import checkpoint


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


def token_entropy(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """Entropy of softmax(logits / temperature) at each position: falling fast means collapse, rising means junk."""
    logp = torch.log_softmax(logits.float() / temperature, dim=-1)
    return -(logp.exp() * logp).sum(-1)


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


def reply_forward(model, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """The model's output for the last width + 1 positions: what predicts each target, and one more."""
    out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                position_ids=batch["position_ids"], logits_to_keep=batch["targets"].shape[1] + 1, use_cache=False)
    return out.logits


def reply_logits(model, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Logits that predict each target position (batch, width, vocab)."""
    return reply_forward(model, batch)[:, :-1]


class LogprobHead(torch.nn.Module):
    """The policy's output layer, in place of its lm_head. While `scoring` is set, the model's forward gives,
    in place of logits, the log-prob of each target token and the entropy at its position (batch, width, 2),
    computed for `chunk` reply tokens at a time; backward recomputes a chunk's logits instead of keeping them
    (torch's checkpoint). So the loss holds about chunk x vocabulary x 12 bytes of logits whatever the reply
    length, not (batch x width x vocabulary) of them and as much again for their gradient. Otherwise it is the
    plain linear layer (generation). It holds lm_head's own parameters under their names, so checkpoints,
    tied embeddings, LoRA and sharding (FSDP, ZeRO-3 gather a module's own parameters for its forward) see
    the lm_head they know."""

    def __init__(self, lm_head: torch.nn.Linear, chunk: int):
        super().__init__()
        self.weight, self.bias, self.chunk = lm_head.weight, lm_head.bias, chunk
        self.scoring: tuple[torch.Tensor, torch.Tensor, float] | None = None  # targets, reply mask, temperature

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        if self.scoring is None:
            return torch.nn.functional.linear(hidden, self.weight, self.bias)
        targets, mask, temperature = self.scoring
        rows, picked = hidden[:, :-1][mask], targets[mask]  # reply positions only: padding costs nothing
        parts = [checkpoint(self._score, rows[i:i + self.chunk], picked[i:i + self.chunk], temperature,
                            use_reentrant=False)
                 for i in range(0, len(rows), self.chunk) or [0]]  # one empty chunk keeps the weight in the graph
        scores = torch.zeros((*targets.shape, 2), device=hidden.device)
        scores[mask] = torch.cat(parts)
        return scores

    def _score(self, rows: torch.Tensor, picked: torch.Tensor, temperature: float) -> torch.Tensor:
        logits = torch.nn.functional.linear(rows, self.weight, self.bias)
        logprobs = token_logprobs(logits, picked, temperature)
        with torch.no_grad():  # last, so backward's recomputation stops before it
            entropy = token_entropy(logits, temperature)
        return torch.stack([logprobs, entropy], dim=-1)


def put_logprob_head(model, chunk: int):
    """`model` with a LogprobHead of `chunk` tokens in place of its output layer (in place; returned)."""
    model.set_output_embeddings(LogprobHead(model.get_output_embeddings(), chunk))
    return model


def reply_logprobs(model, batch: dict[str, torch.Tensor], temperature: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(log-prob of each target at `temperature`, entropy at its position), both (batch, width) in fp32 and 0
    off the reply mask, through the model's LogprobHead (put_logprob_head)."""
    head = next((m for m in model.modules() if isinstance(m, LogprobHead)), None)
    if head is None:
        raise ValueError("reply_logprobs needs the model's output layer to be a LogprobHead: put_logprob_head(model)")
    head.scoring = (batch["targets"], batch["reply_mask"], temperature)
    try:
        scores = reply_forward(model, batch)
    finally:
        head.scoring = None
    return scores[..., 0], scores[..., 1]
