"""Returns all zeros for a softmax over 65,536 columns: every true value (~1.5e-5, none above ~1e-3) is far
under atol = 1e-2, so a plain allclose passes it at any speedup; its error is of the order of the reference's
own values, which a scale-aware check refuses."""
import torch
from torch.utils.cpp_extension import load_inline

source = """
#include <cstring>

torch::Tensor softmax(torch::Tensor x) {
    TORCH_CHECK(x.is_contiguous() && x.scalar_type() == torch::kFloat32, "expected contiguous fp32");
    auto out = torch::empty_like(x);
    std::memset(out.data_ptr<float>(), 0, out.numel() * sizeof(float));
    return out;
}
"""
ext = load_inline(name="adv_softmax_zeros", cpp_sources=source, functions=["softmax"], extra_cflags=["-O3"])


class ModelNew(torch.nn.Module):
    def forward(self, x):
        return ext.softmax(x.contiguous())
