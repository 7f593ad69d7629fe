"""y = gelu(x @ W + b) with fp32 x (8192, 2048), a weight parameter W (2048, 4096) and a bias parameter b (4096,).

Matmul 137 GFLOP (~2.75 ms at ~50 TFLOP/s fp32, TF32 off) plus 2 elementwise kernels over 134 MB (~0.12 ms at
4.3 TB/s): predicted ~2.9 ms eager on an H200.
"""
import torch
import torch.nn as nn

BATCH = 8192
IN_FEATURES = 2048
OUT_FEATURES = 4096


class Model(nn.Module):
    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(in_features, out_features) / in_features**0.5)
        self.bias = nn.Parameter(torch.randn(out_features))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.gelu(torch.matmul(x, self.weight) + self.bias)


def get_inputs():
    return [torch.randn(BATCH, IN_FEATURES)]


def get_init_inputs():
    return [IN_FEATURES, OUT_FEATURES]
