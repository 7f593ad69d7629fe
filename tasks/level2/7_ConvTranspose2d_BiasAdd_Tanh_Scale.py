"""y = tanh(convT(x) + b) * scale: ConvTranspose2d 64 -> 32, 4x4, stride 2, padding 1, on fp32 x (32, 64, 128, 128); bias b (32, 1, 1).

Output (32, 32, 256, 256). Transposed conv 34 GFLOP (~0.69 ms at ~50 TFLOP/s fp32) plus 3 elementwise kernels,
6 passes over the 0.27 GB output (~0.37 ms at 4.3 TB/s): predicted ~1.1 ms eager on an H200.
"""
import torch
import torch.nn as nn

BATCH = 32
IN_CHANNELS = 64
OUT_CHANNELS = 32
HEIGHT = 128
WIDTH = 128
KERNEL_SIZE = 4
STRIDE = 2
PADDING = 1
SCALE = 2.0


class Model(nn.Module):
    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, stride: int, padding: int, scale: float):
        super().__init__()
        self.conv_transpose = nn.ConvTranspose2d(in_channels, out_channels, kernel_size, stride=stride, padding=padding)
        self.bias = nn.Parameter(torch.randn(out_channels, 1, 1))
        self.scale = scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.conv_transpose(x) + self.bias) * self.scale


def get_inputs():
    return [torch.randn(BATCH, IN_CHANNELS, HEIGHT, WIDTH)]


def get_init_inputs():
    return [IN_CHANNELS, OUT_CHANNELS, KERNEL_SIZE, STRIDE, PADDING, SCALE]
