"""Per-sample mean squared error, mean((pred - target)^2, dim=1), for fp32 pred and target (65536, 1024) -> (65536,).

Eager runs 3 kernels (subtract, square, mean), 6 passes over 0.27 GB = 1.6 GB moved, predicted ~0.37 ms on an
H200 at 4.3 TB/s. Reduced per sample, not to one scalar, so the output is not a single near-constant number.
"""
import torch
import torch.nn as nn

BATCH = 65536
DIM = 1024


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, pred: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return torch.mean((pred - target) ** 2, dim=1)


def get_inputs():
    return [torch.randn(BATCH, DIM), torch.randn(BATCH, DIM)]


def get_init_inputs():
    return []
