"""ReLU on an fp32 tensor of shape (512, 512): held out of the warm start (no library variant
names it), the same operator and element count as tests/tasks/level1/7_ReLU.py in another
shape, for the held-out evaluation (bench/kevin_table.py) on the CPU."""
import torch
import torch.nn as nn

BATCH = 512
DIM = 512


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x)


def get_inputs():
    return [torch.randn(BATCH, DIM)]


def get_init_inputs():
    return []
