"""y = avgpool2x2(clamp(hardswish(conv(x)), -0.2, 0.4)) -> (32, 64, 64, 64): Conv2d 64 -> 64, 5x5, padding 2, on fp32 x (32, 64, 128, 128).

Conv 107 GFLOP (~2.15 ms at ~50 TFLOP/s fp32) plus 3 kernels, ~5 passes over the 0.27 GB conv output (~0.16 ms
at 4.3 TB/s): predicted ~2.3 ms eager on an H200, measured ~1.0 ms with cuDNN's default TF32. Clamps only tails.
"""
import torch
import torch.nn as nn

BATCH = 32
CHANNELS = 64
HEIGHT = 128
WIDTH = 128
KERNEL_SIZE = 5
CLAMP_MIN = -0.2
CLAMP_MAX = 0.4
POOL_SIZE = 2


class Model(nn.Module):
    def __init__(self, channels: int, kernel_size: int, clamp_min: float, clamp_max: float, pool_size: int):
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, kernel_size, padding=kernel_size // 2)
        self.clamp_min = clamp_min
        self.clamp_max = clamp_max
        self.pool = nn.AvgPool2d(pool_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = nn.functional.hardswish(self.conv(x))
        return self.pool(torch.clamp(y, self.clamp_min, self.clamp_max))


def get_inputs():
    return [torch.randn(BATCH, CHANNELS, HEIGHT, WIDTH)]


def get_init_inputs():
    return [CHANNELS, KERNEL_SIZE, CLAMP_MIN, CLAMP_MAX, POOL_SIZE]
