"""y = maxpool2x2(relu(conv(x) + b)): Conv2d 32 -> 64, 3x3, padding 1, on fp32 x (64, 32, 128, 128); extra bias b (64, 1, 1).

Output (64, 64, 64, 64). Conv 39 GFLOP (~0.77 ms at ~50 TFLOP/s fp32) plus bias add, ReLU and pooling, ~5 passes
over the 0.27 GB conv output (~0.33 ms at 4.3 TB/s): predicted ~1.1 ms eager on an H200.
"""
import torch
import torch.nn as nn

BATCH = 64
IN_CHANNELS = 32
OUT_CHANNELS = 64
HEIGHT = 128
WIDTH = 128
KERNEL_SIZE = 3
POOL_SIZE = 2


class Model(nn.Module):
    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, pool_size: int):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size, padding=kernel_size // 2)
        self.bias = nn.Parameter(torch.randn(out_channels, 1, 1))
        self.pool = nn.MaxPool2d(pool_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.pool(torch.relu(self.conv(x) + self.bias))


def get_inputs():
    return [torch.randn(BATCH, IN_CHANNELS, HEIGHT, WIDTH)]


def get_init_inputs():
    return [IN_CHANNELS, OUT_CHANNELS, KERNEL_SIZE, POOL_SIZE]
