"""Hyperbolic tangent on an fp32 tensor of shape (2048, 8192): held out of the warm start (no library variant
names it), the same operator and element count as solutions/warm_start/tasks/level1/10_Tanh.py in another
shape, for the held-out evaluation (bench/kevin_table.py)."""
import torch
import torch.nn as nn

BATCH = 2048
DIM = 8192


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(x)


def get_inputs():
    return [torch.randn(BATCH, DIM)]


def get_init_inputs():
    return []
