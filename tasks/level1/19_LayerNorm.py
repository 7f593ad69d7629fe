"""LayerNorm over the last dimension (4096) of an fp32 tensor (32, 1024, 4096), with learned weight and bias (4096,).

One fused eager kernel: 0.54 GB read + 0.54 GB written = 1.07 GB, predicted ~0.25 ms on an H200 at 4.3 TB/s.
"""
import torch
import torch.nn as nn

BATCH = 32
SEQ = 1024
HIDDEN = 4096
EPS = 1e-5


class Model(nn.Module):
    def __init__(self, hidden: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.randn(hidden))
        self.bias = nn.Parameter(torch.randn(hidden))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.layer_norm(x, (x.shape[-1],), self.weight, self.bias, self.eps)


def get_inputs():
    return [torch.randn(BATCH, SEQ, HIDDEN)]


def get_init_inputs():
    return [HIDDEN, EPS]
