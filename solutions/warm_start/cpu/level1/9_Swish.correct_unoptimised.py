"""A C++ loop applies Swish to every element, split over threads with at::parallel_for, with optimisation turned
off for this file."""
import torch
from torch.utils.cpp_extension import load_inline

swish_source = """
#pragma GCC optimize("O0")
float swish_fn(float v) { return v / (1.f + std::exp(-v)); }

torch::Tensor swish_forward(torch::Tensor x) {
    auto y = torch::empty_like(x);
    float* in = x.data_ptr<float>();
    float* out = y.data_ptr<float>();
    at::parallel_for(0, x.numel(), 1 << 14, [&](int64_t begin, int64_t end) {
        for (int64_t i = begin; i < end; ++i) out[i] = swish_fn(in[i]);
    });
    return y;
}
"""
swish_ext = load_inline(name="swish_ext", cpp_sources=swish_source, functions=["swish_forward"], extra_cflags=["-O3"])


class ModelNew(torch.nn.Module):
    def forward(self, x):
        return swish_ext.swish_forward(x)
