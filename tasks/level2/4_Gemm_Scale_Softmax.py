"""y = softmax(scale * (x @ W^T + b), dim=1): nn.Linear 4096 -> 1024 on fp32 x (16384, 4096), scale 5, row softmax.

GEMM 137 GFLOP (~2.75 ms at ~50 TFLOP/s fp32, TF32 off) plus scale and softmax, 4 passes over 67 MB (~0.06 ms
at 4.3 TB/s): predicted ~2.8 ms eager on an H200. The scale sharpens the rows so probabilities are not all ~1/1024.
"""
import torch
import torch.nn as nn

BATCH = 16384
IN_FEATURES = 4096
OUT_FEATURES = 1024
SCALE = 5.0


class Model(nn.Module):
    def __init__(self, in_features: int, out_features: int, scale: float):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)
        self.scale = scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(self.linear(x) * self.scale, dim=1)


def get_inputs():
    return [torch.randn(BATCH, IN_FEATURES)]


def get_init_inputs():
    return [IN_FEATURES, OUT_FEATURES, SCALE]
