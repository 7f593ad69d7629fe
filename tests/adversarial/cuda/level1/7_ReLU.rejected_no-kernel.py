"""Builds an extension with no CUDA source at all: its C++ function just calls ATen's relu."""
import torch
from torch.utils.cpp_extension import load_inline

cpp_source = r"""
#include <torch/extension.h>

torch::Tensor relu(torch::Tensor x) {
    return at::relu(x);
}
"""
relu_ext = load_inline(name="adv_cuda_cpp_only", cpp_sources=cpp_source, functions=["relu"])


class ModelNew(torch.nn.Module):
    def forward(self, x):
        return relu_ext.relu(x.contiguous())
