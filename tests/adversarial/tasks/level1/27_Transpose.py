"""Transpose of an fp32 matrix (8192, 8192) into a new contiguous one: a task whose whole work a copy can
do, for the adversarial candidates that hide their work in copies.

0.5 GB moved: ~0.15 ms at the H200's ~4 TB/s, more for the strided side of a transpose.
"""
import torch
import torch.nn as nn

SIZE = 8192


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.t().contiguous()


def get_inputs():
    return [torch.randn(SIZE, SIZE)]


def get_init_inputs():
    return []
