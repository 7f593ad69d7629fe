"""y = (leaky_relu(x @ W^T + b, 0.1) + x) * 0.5: nn.Linear 4096 -> 4096 on fp32 x (4096, 4096).

GEMM 137 GFLOP (~2.75 ms at ~50 TFLOP/s fp32, TF32 off) plus 3 elementwise kernels, 7 passes over 67 MB
(~0.11 ms at 4.3 TB/s): predicted ~2.9 ms eager on an H200.
"""
import torch
import torch.nn as nn

BATCH = 4096
HIDDEN = 4096
NEGATIVE_SLOPE = 0.1
SCALE = 0.5


class Model(nn.Module):
    def __init__(self, hidden: int, negative_slope: float, scale: float):
        super().__init__()
        self.linear = nn.Linear(hidden, hidden)
        self.negative_slope = negative_slope
        self.scale = scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = nn.functional.leaky_relu(self.linear(x), negative_slope=self.negative_slope)
        return (y + x) * self.scale


def get_inputs():
    return [torch.randn(BATCH, HIDDEN)]


def get_init_inputs():
    return [HIDDEN, NEGATIVE_SLOPE, SCALE]
