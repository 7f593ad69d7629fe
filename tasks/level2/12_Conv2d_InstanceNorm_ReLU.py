"""y = relu(InstanceNorm2d(conv(x))): Conv2d 128 -> 128, 3x3, padding 1, on fp32 x (32, 128, 64, 64).

Conv 39 GFLOP (~0.77 ms at ~50 TFLOP/s fp32) plus instance norm and ReLU, ~5 passes over the 67 MB conv output
(~0.08 ms at 4.3 TB/s): predicted ~0.85 ms eager on an H200.
"""
import torch
import torch.nn as nn

BATCH = 32
CHANNELS = 128
HEIGHT = 64
WIDTH = 64
KERNEL_SIZE = 3


class Model(nn.Module):
    def __init__(self, channels: int, kernel_size: int):
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, kernel_size, padding=kernel_size // 2)
        self.norm = nn.InstanceNorm2d(channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.norm(self.conv(x)))


def get_inputs():
    return [torch.randn(BATCH, CHANNELS, HEIGHT, WIDTH)]


def get_init_inputs():
    return [CHANNELS, KERNEL_SIZE]
