"""y = relu(x @ W^T + b) * scale: nn.Linear 4096 -> 4096 on fp32 x (4096, 4096), then ReLU, then a constant scale.

GEMM 137 GFLOP (~2.75 ms at ~50 TFLOP/s fp32, TF32 off) plus 2 elementwise kernels over 67 MB (~0.06 ms at
4.3 TB/s): predicted ~2.8 ms eager on an H200.
"""
import torch
import torch.nn as nn

BATCH = 4096
IN_FEATURES = 4096
OUT_FEATURES = 4096
SCALE = 0.5


class Model(nn.Module):
    def __init__(self, in_features: int, out_features: int, scale: float):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)
        self.scale = scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.linear(x)) * self.scale


def get_inputs():
    return [torch.randn(BATCH, IN_FEATURES)]


def get_init_inputs():
    return [IN_FEATURES, OUT_FEATURES, SCALE]
