"""Leaky ReLU with negative slope 0.01 on an fp32 tensor of shape (32768, 4096).

One elementwise pass: 0.54 GB read + 0.54 GB written = 1.07 GB, predicted ~0.25 ms eager on an H200 at 4.3 TB/s.
"""
import torch
import torch.nn as nn

BATCH = 32768
DIM = 4096
NEGATIVE_SLOPE = 0.01


class Model(nn.Module):
    def __init__(self, negative_slope: float):
        super().__init__()
        self.negative_slope = negative_slope

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.leaky_relu(x, negative_slope=self.negative_slope)


def get_inputs():
    return [torch.randn(BATCH, DIM)]


def get_init_inputs():
    return [NEGATIVE_SLOPE]
