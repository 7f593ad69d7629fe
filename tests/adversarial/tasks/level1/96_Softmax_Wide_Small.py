"""Softmax over the last dimension of an fp32 tensor (4, 65536): a task whose every output, ~1/65536 = 1.5e-5
on average and below 1e-3 even for the largest of randn's draws, is far under an absolute tolerance of
1e-2, so all zeros pass a plain allclose (KernelBench issue 165); a CPU-sized row count, with the wide rows
that make it degenerate kept.
"""
import torch
import torch.nn as nn

BATCH = 4
DIM = 65536


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(x, dim=1)


def get_inputs():
    return [torch.randn(BATCH, DIM)]


def get_init_inputs():
    return []
