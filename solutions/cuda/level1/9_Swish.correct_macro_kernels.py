"""Swish in one fused pass, its scalar and float4 kernels stamped out by macros and chosen at run time by alignment."""
import torch
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
// One elementwise kernel per use of the macro: `expr` computes the output from the input value `v`.
#define UNARY_KERNEL(name, expr)                                                                   \
    __global__ void name(const float* __restrict__ x, float* __restrict__ y, int64_t n) {          \
        for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;                    \
             i += (int64_t)gridDim.x * blockDim.x) {                                               \
            const float v = x[i];                                                                  \
            y[i] = (expr);                                                                         \
        }                                                                                          \
    }

// The same with 16-byte loads and stores: `expr` is applied to each of the four lanes.
#define UNARY_KERNEL_VEC4(name, expr)                                                              \
    __global__ void name(const float4* __restrict__ x, float4* __restrict__ y, int64_t n4) {       \
        for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n4;                   \
             i += (int64_t)gridDim.x * blockDim.x) {                                               \
            const float4 in = x[i];                                                                \
            float4 out;                                                                            \
            { const float v = in.x; out.x = (expr); }                                              \
            { const float v = in.y; out.y = (expr); }                                              \
            { const float v = in.z; out.z = (expr); }                                              \
            { const float v = in.w; out.w = (expr); }                                              \
            y[i] = out;                                                                            \
        }                                                                                          \
    }

// x * sigmoid(x), fused: one read and one write per element instead of eager's two passes.
#define SWISH(v) ((v) / (1.f + expf(-(v))))

UNARY_KERNEL(swish_scalar_kernel, SWISH(v))
UNARY_KERNEL_VEC4(swish_vec4_kernel, SWISH(v))

static int blocks_for(int64_t n, int threads) {
    return (int)std::max<int64_t>(1, std::min<int64_t>((n + threads - 1) / threads, 132 * 16));
}

torch::Tensor swish(torch::Tensor x) {
    TORCH_CHECK(x.is_cuda() && x.is_contiguous() && x.scalar_type() == torch::kFloat32, "expected contiguous fp32 CUDA");
    auto y = torch::empty_like(x);
    const int64_t n = x.numel();
    if (n == 0) return y;
    const float* xp = x.data_ptr<float>();
    float* yp = y.data_ptr<float>();
    const int threads = 256;
    const bool aligned = reinterpret_cast<uintptr_t>(xp) % 16 == 0 && reinterpret_cast<uintptr_t>(yp) % 16 == 0;
    int64_t done = 0;
    if (aligned) {  // the bulk in float4s, any remainder (fewer than 4 elements) by the scalar kernel
        const int64_t n4 = n / 4;
        if (n4) swish_vec4_kernel<<<blocks_for(n4, threads), threads>>>(
            reinterpret_cast<const float4*>(xp), reinterpret_cast<float4*>(yp), n4);
        done = n4 * 4;
    }
    if (done < n) swish_scalar_kernel<<<blocks_for(n - done, threads), threads>>>(xp + done, yp + done, n - done);
    TORCH_CHECK(cudaGetLastError() == cudaSuccess, "swish kernel launch failed");
    return y;
}
"""
swish_ext = load_inline(name="swish_macro_kernels", cpp_sources="torch::Tensor swish(torch::Tensor x);",
                        cuda_sources=cuda_source, functions=["swish"], extra_cuda_cflags=["-O3"])


class ModelNew(torch.nn.Module):
    def forward(self, x):
        return swish_ext.swish(x.contiguous())
