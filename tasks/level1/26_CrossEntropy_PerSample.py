"""Per-sample cross-entropy of fp32 logits (16384, 8192) against int64 class targets (16384,) -> (16384,).

Eager: log-softmax (0.54 GB read + 0.54 GB written) then a gather, ~1.07 GB moved, predicted ~0.25 ms on an
H200 at 4.3 TB/s (a fused kernel only reads the logits once).
"""
import torch
import torch.nn as nn

BATCH = 16384
NUM_CLASSES = 8192


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return nn.functional.cross_entropy(logits, targets, reduction="none")


def get_inputs():
    return [torch.randn(BATCH, NUM_CLASSES), torch.randint(0, NUM_CLASSES, (BATCH,))]


def get_init_inputs():
    return []
