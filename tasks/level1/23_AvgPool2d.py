"""2D average pooling, 3x3 window, stride 1, padding 1 (zeros counted), on fp32 input (32, 64, 256, 256); same-size output.

Reads 0.54 GB and writes 0.54 GB: predicted ~0.25 ms at 4.3 TB/s, but eager measured ~1.6 ms on an H200.
"""
import torch
import torch.nn as nn

BATCH = 32
CHANNELS = 64
HEIGHT = 256
WIDTH = 256
KERNEL_SIZE = 3
STRIDE = 1
PADDING = 1


class Model(nn.Module):
    def __init__(self, kernel_size: int, stride: int, padding: int):
        super().__init__()
        self.pool = nn.AvgPool2d(kernel_size, stride=stride, padding=padding)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.pool(x)


def get_inputs():
    return [torch.randn(BATCH, CHANNELS, HEIGHT, WIDTH)]


def get_init_inputs():
    return [KERNEL_SIZE, STRIDE, PADDING]
