"""C = A @ B with a tall, skinny A (65536, 256) and a short, wide B (256, 1024); fp32, C is (65536, 1024).

2 * 65536 * 256 * 1024 = 34 GFLOP over 0.34 GB moved: predicted ~0.7 ms eager on an H200
(fp32 with TF32 off, ~50 TFLOP/s; the 0.27 GB output write alone is ~0.06 ms at 4.3 TB/s).
"""
import torch
import torch.nn as nn

M = 65536
K = 256
N = 1024


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.matmul(a, b)


def get_inputs():
    return [torch.randn(M, K), torch.randn(K, N)]


def get_init_inputs():
    return []
