"""Sum over the middle dimension (keepdim) of an fp32 tensor (64, 4096, 1024) -> (64, 1, 1024).

Reads 1.07 GB and writes 0.26 MB: predicted ~0.25 ms eager on an H200 at 4.3 TB/s.
"""
import torch
import torch.nn as nn

BATCH = 64
REDUCED = 4096
DIM = 1024
REDUCE_DIM = 1


class Model(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.dim = dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sum(x, dim=self.dim, keepdim=True)


def get_inputs():
    return [torch.randn(BATCH, REDUCED, DIM)]


def get_init_inputs():
    return [REDUCE_DIM]
