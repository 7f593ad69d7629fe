"""y = leaky_relu(convT3d(x), 0.2) * m: ConvTranspose3d 32 -> 16, 4x4x4, stride 2, padding 1, on fp32 x (4, 32, 32, 64, 64); multiplier m (16, 1, 1, 1).

Output (4, 16, 64, 128, 128). Transposed conv 34 GFLOP (~0.69 ms at ~50 TFLOP/s fp32) plus 2 elementwise kernels,
4 passes over the 0.27 GB output (~0.25 ms at 4.3 TB/s): predicted ~0.95 ms eager on an H200.
"""
import torch
import torch.nn as nn

BATCH = 4
IN_CHANNELS = 32
OUT_CHANNELS = 16
DEPTH = 32
HEIGHT = 64
WIDTH = 64
KERNEL_SIZE = 4
STRIDE = 2
PADDING = 1
NEGATIVE_SLOPE = 0.2


class Model(nn.Module):
    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, stride: int, padding: int, negative_slope: float):
        super().__init__()
        self.conv_transpose = nn.ConvTranspose3d(in_channels, out_channels, kernel_size, stride=stride, padding=padding)
        self.negative_slope = negative_slope
        self.multiplier = nn.Parameter(torch.randn(out_channels, 1, 1, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = nn.functional.leaky_relu(self.conv_transpose(x), negative_slope=self.negative_slope)
        return y * self.multiplier


def get_inputs():
    return [torch.randn(BATCH, IN_CHANNELS, DEPTH, HEIGHT, WIDTH)]


def get_init_inputs():
    return [IN_CHANNELS, OUT_CHANNELS, KERNEL_SIZE, STRIDE, PADDING, NEGATIVE_SLOPE]
