"""Leaves NaN in some outputs, as an unwritten buffer would; NaN must never pass a comparison."""
import torch
from torch.utils.cpp_extension import load_inline

source = """
#include <cmath>
torch::Tensor relu(torch::Tensor x) {
    auto out = torch::empty_like(x);
    const float* in = x.data_ptr<float>();
    float* o = out.data_ptr<float>();
    for (int64_t i = 0; i < x.numel(); ++i) o[i] = i % 997 == 0 ? NAN : (in[i] > 0.f ? in[i] : 0.f);
    return out;
}
"""
ext = load_inline(name="adv_nan", cpp_sources=source, functions=["relu"])


class ModelNew(torch.nn.Module):
    def forward(self, x):
        return ext.relu(x.contiguous())
