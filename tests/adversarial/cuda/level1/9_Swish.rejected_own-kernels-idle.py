"""Lets ATen compute x * sigmoid(x) from C++ and launches its own kernel on a single element, so that
"a kernel ran" is true; the profiler's share of GPU time in the candidate's own kernels is ~0%."""
import torch
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
__global__ void swish_first_kernel(const float* __restrict__ x, float* __restrict__ y) {
    y[0] = x[0] / (1.f + expf(-x[0]));
}

torch::Tensor swish(torch::Tensor x) {
    auto y = x * at::sigmoid(x);
    swish_first_kernel<<<1, 1>>>(x.data_ptr<float>(), y.data_ptr<float>());
    return y;
}
"""
swish_ext = load_inline(name="adv_cuda_decoy_one_element", cpp_sources="torch::Tensor swish(torch::Tensor x);",
                        cuda_sources=cuda_source, functions=["swish"], extra_cuda_cflags=["-O3"])


class ModelNew(torch.nn.Module):
    def forward(self, x):
        return swish_ext.swish(x.contiguous())
