"""Uses its input as scratch: ReLU computed in place there and written to a new output too. Right values, a
fresh output, but the caller's tensor is changed (a reference run afterwards on it would agree with anything)."""
import torch
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
__global__ void relu_in_place_kernel(float* __restrict__ x, float* __restrict__ out, int64_t n) {
    const int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (i < n) {
        x[i] = fmaxf(x[i], 0.f);
        out[i] = x[i];
    }
}

torch::Tensor relu(torch::Tensor x) {
    auto out = torch::empty_like(x);
    relu_in_place_kernel<<<(unsigned)((x.numel() + 255) / 256), 256>>>(x.data_ptr<float>(), out.data_ptr<float>(),
                                                                       x.numel());
    return out;
}
"""
relu_ext = load_inline(name="adv_cuda_in_place", cpp_sources="torch::Tensor relu(torch::Tensor x);",
                       cuda_sources=cuda_source, functions=["relu"], extra_cuda_cflags=["-O3"])


class ModelNew(torch.nn.Module):
    def forward(self, x):
        return relu_ext.relu(x)
