"""y = relu(GroupNorm(conv3d(x))) -> (8, 32, 64, 64, 64): Conv3d 8 -> 32, 3x3x3, padding 1, on fp32 x (8, 8, 64, 64, 64); GroupNorm(4 groups).

Conv 29 GFLOP (~0.58 ms at ~50 TFLOP/s fp32) plus GroupNorm and ReLU, ~5 passes over the 0.27 GB conv output
(~0.31 ms at 4.3 TB/s): predicted ~0.9 ms, measured ~2.9 ms eager on an H200 (cuDNN is slow with 8 input channels).
"""
import torch
import torch.nn as nn

BATCH = 8
IN_CHANNELS = 8
OUT_CHANNELS = 32
DEPTH = 64
HEIGHT = 64
WIDTH = 64
KERNEL_SIZE = 3
NUM_GROUPS = 4


class Model(nn.Module):
    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, num_groups: int):
        super().__init__()
        self.conv = nn.Conv3d(in_channels, out_channels, kernel_size, padding=kernel_size // 2)
        self.norm = nn.GroupNorm(num_groups, out_channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.norm(self.conv(x)))


def get_inputs():
    return [torch.randn(BATCH, IN_CHANNELS, DEPTH, HEIGHT, WIDTH)]


def get_init_inputs():
    return [IN_CHANNELS, OUT_CHANNELS, KERNEL_SIZE, NUM_GROUPS]
