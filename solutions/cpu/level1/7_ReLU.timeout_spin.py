"""Spins forever in native code, where no Python signal can stop it: only the wall-clock limit does."""
import torch
from torch.utils.cpp_extension import load_inline

source = """
torch::Tensor relu(torch::Tensor x) {
    volatile int spinning = 1;
    while (spinning) {}
    return x;
}
"""
relu_ext = load_inline(name="relu_spin", cpp_sources=source, functions=["relu"])


class ModelNew(torch.nn.Module):
    def forward(self, x):
        return relu_ext.relu(x)
