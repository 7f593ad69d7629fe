"""Logistic sigmoid, 1 / (1 + exp(-x)), on an fp32 tensor of shape (8192, 16384).

One elementwise pass: 0.54 GB read + 0.54 GB written = 1.07 GB, predicted ~0.25 ms eager on an H200 at 4.3 TB/s.
"""
import torch
import torch.nn as nn

BATCH = 8192
DIM = 16384


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(x)


def get_inputs():
    return [torch.randn(BATCH, DIM)]


def get_init_inputs():
    return []
