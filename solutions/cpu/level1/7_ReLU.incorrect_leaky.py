"""A leaky ReLU where a ReLU was asked for: compiles and runs, wrong values."""
import torch
from torch.utils.cpp_extension import load_inline

source = """
torch::Tensor relu(torch::Tensor x) {
    TORCH_CHECK(x.is_contiguous() && x.scalar_type() == torch::kFloat32, "expected contiguous fp32");
    auto out = torch::empty_like(x);
    const float* in = x.data_ptr<float>();
    float* result = out.data_ptr<float>();
    const int64_t n = x.numel();
    at::parallel_for(0, n, 1 << 16, [&](int64_t begin, int64_t end) {
        for (int64_t i = begin; i < end; ++i) result[i] = in[i] > 0.f ? in[i] : 0.1f * in[i];
    });
    return out;
}
"""
relu_ext = load_inline(name="relu_leaky", cpp_sources=source, functions=["relu"], extra_cflags=["-O3"])


class ModelNew(torch.nn.Module):
    def forward(self, x):
        return relu_ext.relu(x.contiguous())
