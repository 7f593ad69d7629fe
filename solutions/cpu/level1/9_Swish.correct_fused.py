"""Swish x * sigmoid(x) in one pass over memory instead of eager's two kernels."""
import torch
from torch.utils.cpp_extension import load_inline

source = """
#include <cmath>
torch::Tensor swish(torch::Tensor x) {
    TORCH_CHECK(x.is_contiguous() && x.scalar_type() == torch::kFloat32, "expected contiguous fp32");
    auto out = torch::empty_like(x);
    const float* in = x.data_ptr<float>();
    float* result = out.data_ptr<float>();
    at::parallel_for(0, x.numel(), 1 << 16, [&](int64_t begin, int64_t end) {
        for (int64_t i = begin; i < end; ++i) result[i] = in[i] / (1.f + std::exp(-in[i]));
    });
    return out;
}
"""
swish_ext = load_inline(name="swish_fused", cpp_sources=source, functions=["swish"], extra_cflags=["-O3"])


class ModelNew(torch.nn.Module):
    def forward(self, x):
        return swish_ext.swish(x.contiguous())
