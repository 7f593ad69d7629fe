"""Turn samples into padded batches and read the policy's log-probs of their replies: the batching that
warm_start.py (supervised) and train.py (GRPO) share, so that both see the same positions and padding
that generation did; and the output layer that train.py puts in the policy so that a 16K-token reply's
vocabulary-sized logits never exist at once."""

import importlib.util
import math
from dataclasses import dataclass

import torch


@dataclass
class Sample:
    prompt_ids: list[int]
    reply_ids: list[int]
    old_logprobs: list[float] | None  # sampling log-probs of the reply tokens; None: the trainer's stand in
    advantage: float
    trainer_logprobs: list[float] | None = None  # the trainer's own before the update (train.py's first pass)


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
    trainer_logprobs = torch.full((len(samples), width), float("nan"))
    for i, s in enumerate(samples):
        ids = s.prompt_ids + s.reply_ids
        input_ids[i, length - len(ids):] = torch.tensor(ids)
        attention_mask[i, length - len(ids):] = 1
        if s.reply_ids:
            reply_mask[i, width - len(s.reply_ids):] = True
            if s.old_logprobs is not None:
                old_logprobs[i, width - len(s.reply_ids):] = torch.tensor(s.old_logprobs)
            if s.trainer_logprobs is not None:
                trainer_logprobs[i, width - len(s.reply_ids):] = torch.tensor(s.trainer_logprobs)
    return {"input_ids": input_ids, "attention_mask": attention_mask,
            "position_ids": (attention_mask.cumsum(1) - 1).clamp(min=0), "targets": input_ids[:, length - width:],
            "reply_mask": reply_mask, "old_logprobs": old_logprobs, "trainer_logprobs": trainer_logprobs,
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
    from `chunk` reply tokens' logits a vocabulary tile at a time (ChunkedScores): whatever the reply length and
    vocabulary, the loss holds one chunk's logits of one tile, which in backward their gradient overwrites
    (chunk x VOCABULARY_TILE x 2 bytes in bf16 on a GPU, several times that in eager fp32 on a CPU), never
    (batch x width x vocabulary) of them and as much again for their gradient. Otherwise it is the plain
    linear layer (generation). It holds lm_head's own parameters under their names, so checkpoints, tied
    embeddings, LoRA and sharding (FSDP, ZeRO-3 gather a module's own parameters for its forward and
    backward) see the lm_head they know."""

    def __init__(self, lm_head: torch.nn.Linear, chunk: int):
        super().__init__()
        self.weight, self.bias, self.chunk = lm_head.weight, lm_head.bias, chunk
        self.scoring: tuple[torch.Tensor, torch.Tensor, float] | None = None  # targets, reply mask, temperature

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        if self.scoring is None:
            return torch.nn.functional.linear(hidden, self.weight, self.bias)
        targets, mask, temperature = self.scoring
        # reply positions only: padding and prompts cost nothing
        picked = ChunkedScores.apply(hidden[:, :-1][mask], self.weight, self.bias, targets[mask], temperature,
                                     self.chunk)
        scores = torch.zeros((*targets.shape, 2), device=hidden.device)
        scores[mask] = picked
        return scores


class ChunkedScores(torch.autograd.Function):
    """(log-prob of each target, entropy) at a temperature, from rows of final hidden states, without their
    logits ever existing whole: `chunk` rows x a vocabulary tile of logits at a time, the matmul in the autocast
    dtype (as the plain layer's) into the one buffer they ever take, folded in fp32 into each row's running
    log-sum-exp (fold_tile). Backward recomputes the logits a chunk and a tile at a time into that buffer, turns
    them in place into their gradient, d log p / d z = onehot - softmax (the forward's log normaliser makes a
    tile's softmax), and sums its products in fp32. The entropy is for watching only (no gradient)."""

    @staticmethod
    def forward(ctx, rows, weight, bias, targets, temperature: float, chunk: int):
        device = rows.device.type
        low = rows.to(torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else rows.dtype)
        stats = torch.zeros((4, len(rows)), device=rows.device)  # per row: max, sum exp, sum exp x logit, target
        stats[0] = -math.inf
        tile = torch.empty((min(chunk, len(rows)), VOCABULARY_TILE), dtype=low.dtype, device=rows.device)
        fold, _ = tile_steps(rows.device)
        for start, w, b in vocabulary_tiles(weight, bias, low.dtype):  # each tile cast once
            for i in range(0, len(rows), chunk):
                fold(project(low[i:i + chunk], w, b, tile), targets[i:i + chunk] - start, stats[:, i:i + chunk],
                     temperature)
            del w, b  # before the next tile is cast: one is ever held (a 7B model's last tile: 0.14 GiB)
        top, total, weighted, target_logit = stats
        log_norm = top + total.log()
        ctx.save_for_backward(low, weight, bias, targets, log_norm)
        ctx.temperature, ctx.chunk, ctx.rows_dtype = temperature, chunk, rows.dtype
        return torch.stack([target_logit - log_norm, log_norm - weighted / total], -1)

    @staticmethod
    def backward(ctx, grad_scores):
        rows, weight, bias, targets, log_norm = ctx.saved_tensors
        want_rows, want_weight, want_bias = ctx.needs_input_grad[:3]
        grad_rows = torch.zeros(rows.shape, device=rows.device) if want_rows else None
        grad_weight = torch.zeros(weight.shape, device=weight.device) if want_weight else None
        grad_bias = torch.zeros(bias.shape, device=bias.device) if want_bias else None
        tile = torch.empty((min(ctx.chunk, len(rows)), VOCABULARY_TILE), dtype=rows.dtype, device=rows.device)
        _, gradient = tile_steps(rows.device)
        grad_logprobs = grad_scores[:, 0].contiguous()
        for start, w, b in vocabulary_tiles(weight, bias, rows.dtype):  # each tile cast once
            for i in range(0, len(rows), ctx.chunk):
                r = rows[i:i + ctx.chunk]
                grad = project(r, w, b, tile)
                gradient(grad, targets[i:i + ctx.chunk] - start, log_norm[i:i + ctx.chunk],
                         grad_logprobs[i:i + ctx.chunk], ctx.temperature)
                if want_rows:
                    add_product(grad_rows[i:i + ctx.chunk], grad, w)
                if want_weight:
                    add_product(grad_weight[start:start + len(w)], grad.t(), r)
                if want_bias:
                    grad_bias[start:start + len(w)] += grad.sum(0, dtype=torch.float32)
            del w, b
        return (grad_rows if grad_rows is None else grad_rows.to(ctx.rows_dtype),
                grad_weight if grad_weight is None else grad_weight.to(weight.dtype),
                grad_bias if grad_bias is None else grad_bias.to(bias.dtype), None, None, None)


VOCABULARY_TILE = 32768  # output-layer rows a tile: cast to the matmul's dtype at once, and the logits' width


def vocabulary_tiles(weight: torch.Tensor, bias: torch.Tensor | None, dtype: torch.dtype):
    """(first row, weight rows, bias) a tile at a time in `dtype`: fp32 master weights under autocast are never
    copied whole to bf16 (1 GB for a 7B model's output layer)."""
    for start in range(0, len(weight), VOCABULARY_TILE):
        yield (start, weight[start:start + VOCABULARY_TILE].to(dtype),
               None if bias is None else bias[start:start + VOCABULARY_TILE].to(dtype))


def project(rows: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, tile: torch.Tensor) -> torch.Tensor:
    """rows @ weight.T + bias written into the top left of `tile`, the one buffer a pass's logits ever take."""
    logits = tile[:len(rows), :len(weight)]
    if bias is None:
        return torch.mm(rows, weight.t(), out=logits)
    return torch.addmm(bias, rows, weight.t(), out=logits)


def tile_steps(device: torch.device):
    """(fold_tile, tile_gradient) for tiles on `device`: on a GPU the Triton kernels of logprob_kernels.py (one
    pass over the bf16 tile each), elsewhere the eager definitions below, which are what those kernels compute."""
    if device.type == "cuda" and importlib.util.find_spec("triton"):
        from kevin import logprob_kernels

        return logprob_kernels.fold_tile, logprob_kernels.tile_gradient
    return fold_tile, tile_gradient


def fold_tile(logits: torch.Tensor, local_targets: torch.Tensor, stats: torch.Tensor, temperature: float) -> None:
    """One vocabulary tile of a chunk's logits folded into its rows' running (max, sum of exp, sum of exp x logit,
    target logit), `stats` (4, rows), in place, all of logits / temperature in fp32: an online log-sum-exp, whose
    entropy is log Z - E_p[z]."""
    z = logits.float() / temperature
    top, total, weighted, target_logit = stats
    new_top = torch.maximum(top, z.amax(-1))
    scale = torch.exp(top - new_top)
    e = torch.exp(z - new_top[:, None])
    inside = (local_targets >= 0) & (local_targets < z.shape[1])
    picked = z.gather(-1, local_targets.clamp(0, z.shape[1] - 1)[:, None]).squeeze(-1)
    stats.copy_(torch.stack([new_top, total * scale + e.sum(-1), weighted * scale + (e * z).sum(-1),
                             torch.where(inside, picked, target_logit)]))


def tile_gradient(logits: torch.Tensor, local_targets: torch.Tensor, log_norm: torch.Tensor,
                  grad_logprobs: torch.Tensor, temperature: float) -> None:
    """Overwrites one vocabulary tile of a chunk's logits with the loss's gradient with respect to them,
    (onehot - softmax) x grad / temperature, from fp32: in place, so backward holds one tile as forward does."""
    p = torch.exp(logits.float() / temperature - log_norm[:, None])
    onehot = torch.arange(logits.shape[1], device=logits.device) == local_targets[:, None]
    logits.copy_((onehot.float() - p) * (grad_logprobs[:, None] / temperature))


def add_product(total: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> None:
    """total += a @ b into fp32 `total`, summed in fp32: bf16 products rounded before the sum over chunks and
    tiles would make the gradient depend on the chunk size."""
    if a.is_cuda and a.dtype != torch.float32:
        torch.addmm(total, a, b, out_dtype=torch.float32, out=total)
    else:
        total.addmm_(a.float(), b.float())


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
