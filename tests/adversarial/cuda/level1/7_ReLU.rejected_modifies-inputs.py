"""Computes ReLU in place in its input and returns it: right values, no allocation, but the caller's
tensor is destroyed (and a reference run afterwards on the same tensor would agree with anything)."""
import torch
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
__global__ void relu_in_place_kernel(float* __restrict__ x, int64_t n) {
    const int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (i < n) x[i] = fmaxf(x[i], 0.f);
}

torch::Tensor relu(torch::Tensor x) {
    relu_in_place_kernel<<<(unsigned)((x.numel() + 255) / 256), 256>>>(x.data_ptr<float>(), x.numel());
    return x;
}
"""
relu_ext = load_inline(name="adv_cuda_in_place", cpp_sources="torch::Tensor relu(torch::Tensor x);",
                       cuda_sources=cuda_source, functions=["relu"], extra_cuda_cflags=["-O3"])


class ModelNew(torch.nn.Module):
    def forward(self, x):
        return relu_ext.relu(x)
