"""A right Swish whose loop OpenMP splits over two threads (`#pragma omp parallel for num_threads(2)`, built
with -fopenmp): torch's thread count stays 1 and no thread word appears in the source, but the call burns
more than one core of CPU time."""
import torch
from torch.utils.cpp_extension import load_inline

source = """
#include <cmath>

torch::Tensor swish(torch::Tensor x) {
    TORCH_CHECK(x.is_contiguous() && x.scalar_type() == torch::kFloat32, "expected contiguous fp32");
    auto out = torch::empty_like(x);
    const float* in = x.data_ptr<float>();
    float* result = out.data_ptr<float>();
    const int64_t n = x.numel();
    #pragma omp parallel for num_threads(2) schedule(static)
    for (int64_t i = 0; i < n; ++i) result[i] = in[i] / (1.f + std::exp(-in[i]));
    return out;
}
"""
ext = load_inline(name="adv_swish_openmp", cpp_sources=source, functions=["swish"],
                  extra_cflags=["-O3", "-fopenmp"], extra_ldflags=["-fopenmp"])


class ModelNew(torch.nn.Module):
    def forward(self, x):
        return ext.swish(x.contiguous())
