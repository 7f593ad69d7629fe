"""The output layer's two elementwise steps as Triton kernels, for tiles on a GPU: batching.fold_tile and
batching.tile_gradient (the eager definitions, which the CPU runs) with the tile read once, in place. What
torch.compile made of the eager functions (dynamic shapes) ran at a quarter to a half of the H200's bandwidth
and took a third of the layer's time; these do one pass each, a program per row (fold) or per row and block (gradient)."""
import torch
import triton
import triton.language as tl

BLOCK = 1024  # logits a program holds at once


@triton.jit
def fold_kernel(logits, logits_row_stride, local_targets, stats, stats_row_stride, columns, inverse_temperature,
                BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    line = logits + row * logits_row_stride
    top = tl.load(stats + row)
    total = tl.load(stats + stats_row_stride + row)
    weighted = tl.load(stats + 2 * stats_row_stride + row)
    for start in range(0, columns, BLOCK):
        at = start + tl.arange(0, BLOCK)
        inside = at < columns
        z = tl.load(line + at, mask=inside, other=-float("inf")).to(tl.float32) * inverse_temperature
        new_top = tl.maximum(top, tl.max(z, axis=0))
        scale = tl.exp(top - new_top)
        e = tl.exp(z - new_top)  # 0 off the tile
        total = total * scale + tl.sum(e, axis=0)
        weighted = weighted * scale + tl.sum(tl.where(inside, e * z, 0.0), axis=0)
        top = new_top
    tl.store(stats + row, top)
    tl.store(stats + stats_row_stride + row, total)
    tl.store(stats + 2 * stats_row_stride + row, weighted)
    target = tl.load(local_targets + row)
    if (target >= 0) & (target < columns):
        picked = tl.load(line + target).to(tl.float32) * inverse_temperature
        tl.store(stats + 3 * stats_row_stride + row, picked)


@triton.jit
def gradient_kernel(logits, logits_row_stride, local_targets, log_norm, grad_logprobs, columns,
                    inverse_temperature, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    at = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    inside = at < columns
    cells = logits + row * logits_row_stride + at
    z = tl.load(cells, mask=inside, other=0.0).to(tl.float32) * inverse_temperature
    p = tl.exp(z - tl.load(log_norm + row))
    onehot = (at == tl.load(local_targets + row)).to(tl.float32)
    g = tl.load(grad_logprobs + row) * inverse_temperature
    tl.store(cells, ((onehot - p) * g).to(logits.dtype.element_ty), mask=inside)


def fold_tile(logits: torch.Tensor, local_targets: torch.Tensor, stats: torch.Tensor, temperature: float) -> None:
    """batching.fold_tile: `stats` (4, rows), a view with unit column stride, updated in place."""
    rows, columns = logits.shape
    assert logits.stride(1) == 1 and stats.stride(1) == 1 and local_targets.is_contiguous()
    fold_kernel[(rows,)](logits, logits.stride(0), local_targets, stats, stats.stride(0), columns, 1 / temperature,
                         BLOCK=BLOCK)


def tile_gradient(logits: torch.Tensor, local_targets: torch.Tensor, log_norm: torch.Tensor,
                  grad_logprobs: torch.Tensor, temperature: float) -> None:
    """batching.tile_gradient: the logits overwritten with their gradient."""
    rows, columns = logits.shape
    assert logits.stride(1) == 1 and all(t.is_contiguous() for t in (local_targets, log_norm, grad_logprobs))
    gradient_kernel[(rows, triton.cdiv(columns, BLOCK))](logits, logits.stride(0), local_targets, log_norm,
                                                         grad_logprobs, columns, 1 / temperature, BLOCK=BLOCK)
