"""Softmax over the last dimension of fp32 logits (32768, 4096), scaled by 3 so each row has a few large probabilities.

One fused eager kernel: 0.54 GB read + 0.54 GB written = 1.07 GB, predicted ~0.25 ms on an H200 at 4.3 TB/s.
"""
import torch
import torch.nn as nn

BATCH = 32768
DIM = 4096
LOGIT_SCALE = 3.0


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(x, dim=-1)


def get_inputs():
    return [torch.randn(BATCH, DIM) * LOGIT_SCALE]


def get_init_inputs():
    return []
