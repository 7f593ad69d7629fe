"""The honest twin of the observed-only kernel beside it: its own kernel on every call."""
import torch
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
__global__ void sigmoid_kernel(const float* __restrict__ x, float* __restrict__ y, int64_t n) {
    const int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (i < n) y[i] = 1.f / (1.f + __expf(-x[i]));
}

torch::Tensor sigmoid(torch::Tensor x) {
    auto y = torch::empty_like(x);
    sigmoid_kernel<<<(unsigned)((x.numel() + 255) / 256), 256>>>(x.data_ptr<float>(), y.data_ptr<float>(), x.numel());
    return y;
}
"""
sigmoid_ext = load_inline(name="sigmoid_observed", cpp_sources="torch::Tensor sigmoid(torch::Tensor x);",
                          cuda_sources=cuda_source, functions=["sigmoid"], extra_cuda_cflags=["-O3"])


class ModelNew(torch.nn.Module):
    def forward(self, x):
        return sigmoid_ext.sigmoid(x.contiguous())
