"""Swish, x * sigmoid(x), on an fp32 tensor of shape (512, 512): held out of the warm start (no library variant
names it), the same operator and element count as tests/tasks/level1/9_Swish.py in another
shape, for the held-out evaluation (bench/kevin_table.py) on the CPU."""
import torch
import torch.nn as nn

BATCH = 512
DIM = 512


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.sigmoid(x)


def get_inputs():
    return [torch.randn(BATCH, DIM)]


def get_init_inputs():
    return []
