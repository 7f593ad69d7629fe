"""Compiles a kernel but returns torch.relu: the static rules reject it before any build."""
import torch
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
__global__ void copy_kernel(const float* x, float* y, int64_t n) {
    int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (i < n) y[i] = x[i];
}
torch::Tensor copy(torch::Tensor x) {
    auto y = torch::empty_like(x);
    copy_kernel<<<(x.numel() + 255) / 256, 256>>>(x.data_ptr<float>(), y.data_ptr<float>(), x.numel());
    return y;
}
"""
decoy = load_inline(name="relu_decoy", cpp_sources="torch::Tensor copy(torch::Tensor x);",
                    cuda_sources=cuda_source, functions=["copy"])


class ModelNew(torch.nn.Module):
    def forward(self, x):
        return torch.relu(decoy.copy(x))
