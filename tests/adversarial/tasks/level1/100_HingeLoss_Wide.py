"""Hinge loss, the mean of clamp(1 - prediction * label, 0), over 2^20 fp32 predictions with labels of ±1: a task
whose output barely moves across the draws of get_inputs (about 1.083, give or take 0.001), so that a kernel writing
that number, whatever its inputs, passes a plain comparison on the task's own draws.
"""
import torch
import torch.nn as nn

SIZE = 1 << 20


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, predictions: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return torch.clamp(1 - predictions * labels, min=0).mean()


def get_inputs():
    return [torch.randn(SIZE), torch.randint(0, 2, (SIZE,)).float() * 2 - 1]


def get_init_inputs():
    return []
