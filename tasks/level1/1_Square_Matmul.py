"""C = A @ B for two square fp32 matrices, A and B of shape (4096, 4096).

2 * 4096^3 = 137 GFLOP over 0.2 GB moved: compute-bound, predicted ~2.7 ms eager on an H200
(fp32 with TF32 off, ~50 TFLOP/s).
"""
import torch
import torch.nn as nn

N = 4096


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.matmul(a, b)


def get_inputs():
    return [torch.randn(N, N), torch.randn(N, N)]


def get_init_inputs():
    return []
