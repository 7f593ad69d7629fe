"""y = A @ x for a (16384, 16384) fp32 matrix A and a column vector x of shape (16384, 1); y is (16384, 1).

Memory-bound: reading A is 1.07 GB (0.5 GFLOP), predicted ~0.25 ms eager on an H200 at 4.3 TB/s.
"""
import torch
import torch.nn as nn

M = 16384
K = 16384


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, a: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        return torch.matmul(a, x)


def get_inputs():
    return [torch.randn(M, K), torch.randn(K, 1)]


def get_init_inputs():
    return []
