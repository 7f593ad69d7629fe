"""GELU (exact, erf form) on an fp32 tensor of shape (4096, 4096): a copy of tasks/level1/8_GELU.py at 1/8 of
its size for the learning demonstration (bench/learning_demo.py), where every kernel is checked and timed
many times; eager PyTorch takes ~0.03 ms here, so timings are noisier than on the full-size task."""
import torch
import torch.nn as nn

BATCH = 4096
DIM = 4096


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.gelu(x)


def get_inputs():
    return [torch.randn(BATCH, DIM)]


def get_init_inputs():
    return []
