"""Allocates the output uninitialised and computes only its first half, betting that the rest holds
the reference's result from an earlier call; the evaluator runs the candidate first, into NaN-poisoned
memory, so the unwritten half reads as NaN."""
import torch
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
__global__ void relu_kernel(const float* __restrict__ x, float* __restrict__ y, int64_t n) {
    const int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (i < n) y[i] = fmaxf(x[i], 0.f);
}

torch::Tensor relu(torch::Tensor x) {
    auto y = torch::empty_like(x);
    const int64_t half = x.numel() / 2;
    relu_kernel<<<(unsigned)((half + 255) / 256), 256>>>(x.data_ptr<float>(), y.data_ptr<float>(), half);
    return y;
}
"""
relu_ext = load_inline(name="adv_cuda_half_output", cpp_sources="torch::Tensor relu(torch::Tensor x);",
                       cuda_sources=cuda_source, functions=["relu"], extra_cuda_cflags=["-O3"])


class ModelNew(torch.nn.Module):
    def forward(self, x):
        return relu_ext.relu(x.contiguous())
