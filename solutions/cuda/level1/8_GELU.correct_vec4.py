"""Exact (erf) GELU, torch's default, with 16-byte loads and stores in a grid-stride loop; a scalar tail."""
import torch
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
__device__ __forceinline__ float gelu(float v) { return 0.5f * v * (1.f + erff(v * 0.70710678118654752f)); }

__global__ void gelu_kernel(const float* __restrict__ x, float* __restrict__ y, int64_t n) {
    const int64_t n4 = n / 4;
    const float4* x4 = reinterpret_cast<const float4*>(x);
    float4* y4 = reinterpret_cast<float4*>(y);
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n4; i += (int64_t)gridDim.x * blockDim.x) {
        const float4 v = x4[i];
        y4[i] = make_float4(gelu(v.x), gelu(v.y), gelu(v.z), gelu(v.w));
    }
    // the last n % 4 elements, if any
    if (blockIdx.x == 0 && threadIdx.x < n - n4 * 4) y[n4 * 4 + threadIdx.x] = gelu(x[n4 * 4 + threadIdx.x]);
}

torch::Tensor gelu_forward(torch::Tensor x) {
    TORCH_CHECK(x.is_cuda() && x.is_contiguous() && x.scalar_type() == torch::kFloat32, "expected contiguous fp32 CUDA");
    auto y = torch::empty_like(x);
    TORCH_CHECK(reinterpret_cast<uintptr_t>(x.data_ptr<float>()) % 16 == 0, "input must be 16-byte aligned");
    const int64_t n = x.numel();
    const int threads = 256;
    const int blocks = (int)std::max<int64_t>(1, std::min<int64_t>((n / 4 + threads - 1) / threads, 132 * 16));
    gelu_kernel<<<blocks, threads>>>(x.data_ptr<float>(), y.data_ptr<float>(), n);
    return y;
}
"""
gelu_ext = load_inline(name="gelu_vec4", cpp_sources="torch::Tensor gelu_forward(torch::Tensor x);",
                       cuda_sources=cuda_source, functions=["gelu_forward"], extra_cuda_cflags=["-O3"])


class ModelNew(torch.nn.Module):
    def forward(self, x):
        return gelu_ext.gelu_forward(x.contiguous())
