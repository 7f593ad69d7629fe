"""A deterministic stand-in for a race: the result depends on a __device__ counter that a second kernel
bumps after every call, so the first call is right and the second, on the same inputs, is off by one."""
import torch
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
__device__ unsigned int launches = 0;

__global__ void relu_kernel(const float* __restrict__ x, float* __restrict__ y, int64_t n) {
    const int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (i < n) y[i] = fmaxf(x[i], 0.f) + (float)(launches & 1u);
}

__global__ void count_launch_kernel() { ++launches; }

torch::Tensor relu(torch::Tensor x) {
    auto y = torch::empty_like(x);
    relu_kernel<<<(unsigned)((x.numel() + 255) / 256), 256>>>(x.data_ptr<float>(), y.data_ptr<float>(), x.numel());
    count_launch_kernel<<<1, 1>>>();
    return y;
}
"""
relu_ext = load_inline(name="adv_cuda_device_counter", cpp_sources="torch::Tensor relu(torch::Tensor x);",
                       cuda_sources=cuda_source, functions=["relu"], extra_cuda_cflags=["-O3"])


class ModelNew(torch.nn.Module):
    def forward(self, x):
        return relu_ext.relu(x.contiguous())
