"""Inherits the reference's forward: KernelBench's evaluator puts `Model` in the candidate's namespace;
here the class is fished out of the garbage collector (the task module is imported first). The own
kernel is there only to satisfy the "has a kernel" rule. The static rule on class bases rejects it."""
import gc

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

Model = next((o for o in gc.get_objects() if isinstance(o, type) and o.__name__ == "Model"
              and issubclass(o, torch.nn.Module)), torch.nn.Module)


class ModelNew(Model):
    """Everything, forward included, comes from the reference."""
