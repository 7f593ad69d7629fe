"""y = maxpool3d(softmax(conv3d(x), dim=1)): Conv3d 16 -> 32, 3x3x3, padding 1, on fp32 x (16, 16, 32, 64, 64); 2x2x2 pooling.

Output (16, 32, 16, 32, 32). Conv 58 GFLOP (~1.16 ms at ~50 TFLOP/s fp32) plus channel softmax and pooling,
~3 passes over the 0.27 GB conv output (~0.2 ms at 4.3 TB/s): predicted ~1.4 ms eager on an H200.
"""
import torch
import torch.nn as nn

BATCH = 16
IN_CHANNELS = 16
OUT_CHANNELS = 32
DEPTH = 32
HEIGHT = 64
WIDTH = 64
KERNEL_SIZE = 3
POOL_SIZE = 2


class Model(nn.Module):
    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, pool_size: int):
        super().__init__()
        self.conv = nn.Conv3d(in_channels, out_channels, kernel_size, padding=kernel_size // 2)
        self.pool = nn.MaxPool3d(pool_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.pool(torch.softmax(self.conv(x), dim=1))


def get_inputs():
    return [torch.randn(BATCH, IN_CHANNELS, DEPTH, HEIGHT, WIDTH)]


def get_init_inputs():
    return [IN_CHANNELS, OUT_CHANNELS, KERNEL_SIZE, POOL_SIZE]
