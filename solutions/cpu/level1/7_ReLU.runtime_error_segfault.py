"""Dereferences a null pointer on the host: the child dies with SIGSEGV, the run goes on."""
import torch
from torch.utils.cpp_extension import load_inline

source = """
torch::Tensor relu(torch::Tensor x) {
    volatile float* nowhere = nullptr;
    nowhere[0] = 1.f;
    return x;
}
"""
relu_ext = load_inline(name="relu_segfault", cpp_sources=source, functions=["relu"])


class ModelNew(torch.nn.Module):
    def forward(self, x):
        return relu_ext.relu(x)
