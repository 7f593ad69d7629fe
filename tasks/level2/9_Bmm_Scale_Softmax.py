"""Attention weights softmax(scale * Q @ K^T, dim=-1) for fp32 Q, K (256, 512, 64) -> (256, 512, 512); scale 0.35.

Batched matmul 8.6 GFLOP (~0.17 ms at ~50 TFLOP/s fp32) plus scale and softmax, 5 passes over the 0.27 GB scores
(~0.31 ms at 4.3 TB/s): predicted ~0.5 ms eager on an H200. A fused kernel never writes the raw scores.
"""
import torch
import torch.nn as nn

BATCH = 256
SEQ = 512
HEAD_DIM = 64
SCALE = 0.35


class Model(nn.Module):
    def __init__(self, scale: float):
        super().__init__()
        self.scale = scale

    def forward(self, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        scores = torch.bmm(q, k.transpose(1, 2)) * self.scale
        return torch.softmax(scores, dim=-1)


def get_inputs():
    return [torch.randn(BATCH, SEQ, HEAD_DIM), torch.randn(BATCH, SEQ, HEAD_DIM)]


def get_init_inputs():
    return [SCALE]
