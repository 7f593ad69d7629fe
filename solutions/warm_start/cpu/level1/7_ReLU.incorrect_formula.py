"""A C++ loop applies ReLU to every element, split over threads with at::parallel_for, keeping a small slope
below zero."""
import torch
from torch.utils.cpp_extension import load_inline

relu_source = """
float relu_fn(float v) { return v > 0.f ? v : 0.1f * v; }

torch::Tensor relu_forward(torch::Tensor x) {
    auto y = torch::empty_like(x);
    float* in = x.data_ptr<float>();
    float* out = y.data_ptr<float>();
    at::parallel_for(0, x.numel(), 1 << 14, [&](int64_t begin, int64_t end) {
        for (int64_t i = begin; i < end; ++i) out[i] = relu_fn(in[i]);
    });
    return y;
}
"""
relu_ext = load_inline(name="relu_ext", cpp_sources=relu_source, functions=["relu_forward"], extra_cflags=["-O3"])


class ModelNew(torch.nn.Module):
    def forward(self, x):
        return relu_ext.relu_forward(x)
