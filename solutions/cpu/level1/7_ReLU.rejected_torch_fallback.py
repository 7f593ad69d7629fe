"""Builds a kernel but answers with torch.relu: the static rules reject it before any build."""
import torch
from torch.utils.cpp_extension import load_inline

source = """
torch::Tensor identity(torch::Tensor x) { return x; }
"""
decoy = load_inline(name="relu_decoy", cpp_sources=source, functions=["identity"])


class ModelNew(torch.nn.Module):
    def forward(self, x):
        return torch.relu(decoy.identity(x))
