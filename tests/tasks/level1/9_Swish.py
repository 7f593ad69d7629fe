"""Swish, x * sigmoid(x), on an fp32 tensor of shape (256, 1024): a CPU-sized copy of tasks/level1/9_Swish.py
for the tests and the CPU demo, where the full size would take seconds per input set."""
import torch
import torch.nn as nn

BATCH = 256
DIM = 1024


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.sigmoid(x)


def get_inputs():
    return [torch.randn(BATCH, DIM)]


def get_init_inputs():
    return []
