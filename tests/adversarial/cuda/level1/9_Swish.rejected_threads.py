"""Launches the kernel from a detached native thread and returns before it has even been queued:
the work would land outside any timed region. Native thread creation is refused by the static rules."""
import torch
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
#include <thread>

__global__ void swish_kernel(const float* __restrict__ x, float* __restrict__ y, int64_t n) {
    const int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (i < n) y[i] = x[i] / (1.f + expf(-x[i]));
}

torch::Tensor swish(torch::Tensor x) {
    auto y = torch::empty_like(x);
    const float* in = x.data_ptr<float>();
    float* out = y.data_ptr<float>();
    const int64_t n = x.numel();
    std::thread([=] { swish_kernel<<<(unsigned)((n + 255) / 256), 256>>>(in, out, n); }).detach();
    return y;
}
"""
swish_ext = load_inline(name="adv_cuda_native_thread", cpp_sources="torch::Tensor swish(torch::Tensor x);",
                        cuda_sources=cuda_source, functions=["swish"], extra_cuda_cflags=["-O3"])


class ModelNew(torch.nn.Module):
    def forward(self, x):
        return swish_ext.swish(x.contiguous())
