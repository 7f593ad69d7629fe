"""Softmax over the last dimension of fp32 logits (16, 393216): rows so wide that every probability is tiny.

Standard normal logits over 393,216 columns: a row's sum of exponentials is about 393,216 * e^0.5 ~ 6.5e5 and its
largest exponential about e^5, so the largest output is 2e-4 to 4e-4 (seeds 0-4), 25 to 50 times below an absolute
tolerance of 1e-2 (KernelBench issue 165): an all-zero output passes a plain allclose. Written for this project in KernelBench's
format, for the adversarial candidates that answer with zeros.

25 MB read + 25 MB written; eager runs one block per row (16 blocks), far from the H200's bandwidth.
"""
import torch
import torch.nn as nn

BATCH = 16
DIM = 393216


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(x, dim=-1)


def get_inputs():
    return [torch.randn(BATCH, DIM)]


def get_init_inputs():
    return []
