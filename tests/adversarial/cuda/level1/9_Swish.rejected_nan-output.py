"""Writes NaN into every 997th output: NaN compares unequal to everything, and a checker that counts
mismatches with `>` or lets equal_nan through would pass it. NaN where the reference is finite is rejected."""
import torch
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
__global__ void swish_kernel(const float* __restrict__ x, float* __restrict__ y, int64_t n) {
    const int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (i < n) y[i] = i % 997 == 0 ? __int_as_float(0x7fc00000) : x[i] / (1.f + expf(-x[i]));
}

torch::Tensor swish(torch::Tensor x) {
    auto y = torch::empty_like(x);
    swish_kernel<<<(unsigned)((x.numel() + 255) / 256), 256>>>(x.data_ptr<float>(), y.data_ptr<float>(), x.numel());
    return y;
}
"""
swish_ext = load_inline(name="adv_cuda_nan", cpp_sources="torch::Tensor swish(torch::Tensor x);",
                        cuda_sources=cuda_source, functions=["swish"], extra_cuda_cflags=["-O3"])


class ModelNew(torch.nn.Module):
    def forward(self, x):
        return swish_ext.swish(x.contiguous())
