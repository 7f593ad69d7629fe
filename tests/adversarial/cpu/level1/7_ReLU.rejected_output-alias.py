"""Computes ReLU right on every call, but always into the same static C++ array wrapped by torch::from_blob: the
output is memory the candidate held before the call, not a tensor the allocator ever handed out, so every
earlier output changes under the caller's feet and repeat checks compare one buffer with itself."""
import torch
from torch.utils.cpp_extension import load_inline

source = """
constexpr int64_t CAPACITY = 256 * 1024;
alignas(64) static float kept[CAPACITY];

torch::Tensor relu(torch::Tensor x) {
    TORCH_CHECK(x.is_contiguous() && x.scalar_type() == torch::kFloat32, "expected contiguous fp32");
    TORCH_CHECK(x.numel() <= CAPACITY, "input larger than the kept buffer");
    const float* in = x.data_ptr<float>();
    const int64_t n = x.numel();
    for (int64_t i = 0; i < n; ++i) kept[i] = in[i] > 0.f ? in[i] : 0.f;
    return torch::from_blob(kept, x.sizes(), x.options());
}
"""
ext = load_inline(name="adv_kept_static_array", cpp_sources=source, functions=["relu"], extra_cflags=["-O3"])


class ModelNew(torch.nn.Module):
    def forward(self, x):
        return ext.relu(x.contiguous())
