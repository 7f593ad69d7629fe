"""y = LayerNorm(x @ W^T + b + x): nn.Linear 4096 -> 4096 on fp32 x (4096, 4096), a residual add, then nn.LayerNorm(4096).

GEMM 137 GFLOP (~2.75 ms at ~50 TFLOP/s fp32, TF32 off) plus add and LayerNorm, ~5 passes over 67 MB
(~0.08 ms at 4.3 TB/s): predicted ~2.8 ms eager on an H200.
"""
import torch
import torch.nn as nn

BATCH = 4096
HIDDEN = 4096


class Model(nn.Module):
    def __init__(self, hidden: int):
        super().__init__()
        self.linear = nn.Linear(hidden, hidden)
        self.norm = nn.LayerNorm(hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(self.linear(x) + x)


def get_inputs():
    return [torch.randn(BATCH, HIDDEN)]


def get_init_inputs():
    return [HIDDEN]
