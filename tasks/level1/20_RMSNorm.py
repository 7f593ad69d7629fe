"""RMSNorm written out, x * rsqrt(mean(x^2, last dim) + eps) * weight, on fp32 x (16, 1024, 4096), weight (4096,).

Eager runs ~5 kernels, about 7 passes over 0.27 GB = 1.9 GB moved, predicted ~0.44 ms on an H200 at 4.3 TB/s
(a fused kernel needs 2 passes).
"""
import torch
import torch.nn as nn

BATCH = 16
SEQ = 1024
HIDDEN = 4096
EPS = 1e-6


class Model(nn.Module):
    def __init__(self, hidden: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.randn(hidden))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        inverse_rms = torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + self.eps)
        return x * inverse_rms * self.weight


def get_inputs():
    return [torch.randn(BATCH, SEQ, HIDDEN)]


def get_init_inputs():
    return [HIDDEN, EPS]
