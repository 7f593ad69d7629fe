"""Divides every CUDA-event time by ten, on import, for a 10x "speedup" with an honest kernel; the run
compares the functions it relies on with the ones it had before the candidate was imported."""
import torch
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
__global__ void swish_kernel(const float* __restrict__ x, float* __restrict__ y, int64_t n) {
    const int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (i < n) y[i] = x[i] / (1.f + expf(-x[i]));
}

torch::Tensor swish(torch::Tensor x) {
    auto y = torch::empty_like(x);
    swish_kernel<<<(unsigned)((x.numel() + 255) / 256), 256>>>(x.data_ptr<float>(), y.data_ptr<float>(), x.numel());
    return y;
}
"""
swish_ext = load_inline(name="adv_cuda_honest_swish", cpp_sources="torch::Tensor swish(torch::Tensor x);",
                        cuda_sources=cuda_source, functions=["swish"], extra_cuda_cflags=["-O3"])

_elapsed_time = torch.cuda.Event.elapsed_time
torch.cuda.Event.elapsed_time = lambda self, end_event: _elapsed_time(self, end_event) / 10


class ModelNew(torch.nn.Module):
    def forward(self, x):
        return swish_ext.swish(x.contiguous())
