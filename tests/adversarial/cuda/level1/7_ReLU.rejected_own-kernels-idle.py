"""Compiles a ReLU kernel it never launches and calls ATen's relu from C++, where the static rules do
not look: only the profiler, which sees no time in the candidate's own kernels, can tell."""
import torch
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
__global__ void relu_kernel(const float* __restrict__ x, float* __restrict__ y, int64_t n) {
    const int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (i < n) y[i] = fmaxf(x[i], 0.f);
}

torch::Tensor relu(torch::Tensor x) {
    return at::relu(x);
}
"""
relu_ext = load_inline(name="adv_cuda_decoy_unlaunched", cpp_sources="torch::Tensor relu(torch::Tensor x);",
                       cuda_sources=cuda_source, functions=["relu"], extra_cuda_cflags=["-O3"])


class ModelNew(torch.nn.Module):
    def forward(self, x):
        return relu_ext.relu(x.contiguous())
