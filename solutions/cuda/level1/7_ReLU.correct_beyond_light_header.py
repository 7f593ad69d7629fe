"""ReLU whose CUDA file names torch's autograd (a compile-time check), which the evaluator's light header
does not declare: the first build fails for a missing name, and it must fall back to the source as written."""
import torch
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
#include <torch/extension.h>

__global__ void relu_kernel(const float* __restrict__ x, float* __restrict__ y, int64_t n) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        y[i] = fmaxf(x[i], 0.f);
}

static_assert(sizeof(torch::autograd::Variable) == sizeof(at::Tensor), "a Variable is a Tensor");

torch::Tensor relu(torch::Tensor x) {
    TORCH_CHECK(x.is_cuda() && x.is_contiguous() && x.scalar_type() == torch::kFloat32, "expected contiguous fp32 CUDA");
    auto y = torch::empty_like(x);
    const int64_t n = x.numel();
    relu_kernel<<<(int)std::min<int64_t>((n + 255) / 256, 132 * 16), 256>>>(x.data_ptr<float>(), y.data_ptr<float>(), n);
    return y;
}
"""
cpp_source = "torch::Tensor relu(torch::Tensor x);"
relu_ext = load_inline(name="relu_beyond_light_header", cpp_sources=cpp_source, cuda_sources=cuda_source,
                       functions=["relu"], extra_cuda_cflags=["-O3"])


class ModelNew(torch.nn.Module):
    def forward(self, x):
        return relu_ext.relu(x.contiguous())
