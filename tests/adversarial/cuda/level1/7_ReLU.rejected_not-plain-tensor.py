"""Returns its (correct) result as a tensor subclass, which could defer or fake its work through
__torch_function__; only plain dense tensors are accepted."""
import torch
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
__global__ void relu_kernel(const float* __restrict__ x, float* __restrict__ y, int64_t n) {
    const int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (i < n) y[i] = fmaxf(x[i], 0.f);
}

torch::Tensor relu(torch::Tensor x) {
    auto y = torch::empty_like(x);
    relu_kernel<<<(unsigned)((x.numel() + 255) / 256), 256>>>(x.data_ptr<float>(), y.data_ptr<float>(), x.numel());
    return y;
}
"""
relu_ext = load_inline(name="adv_cuda_honest_relu", cpp_sources="torch::Tensor relu(torch::Tensor x);",
                       cuda_sources=cuda_source, functions=["relu"], extra_cuda_cflags=["-O3"])


class Deferred(torch.Tensor):
    lazy = True


class ModelNew(torch.nn.Module):
    def forward(self, x):
        return relu_ext.relu(x.contiguous()).as_subclass(Deferred)
