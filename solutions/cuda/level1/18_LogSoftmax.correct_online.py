"""Log-softmax with a block per row in two passes: the first keeps a running (max, sum of exp(x - max)) per
thread, rescaling the sum whenever the max grows, and merges the pairs with warp shuffles; the second
writes x - (max + log(sum)). Rows of any length; 16-byte loads when the row length is a multiple of 4."""
import torch
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
constexpr int THREADS = 512;

// Fold a running pair (m2, s2) into (m, s): both sums re-expressed relative to the larger max.
__device__ __forceinline__ void merge(float& m, float& s, float m2, float s2) {
    const float mn = fmaxf(m, m2);
    if (mn == -INFINITY) return;  // nothing above -inf seen yet: keep s = 0
    s = s * expf(m - mn) + s2 * expf(m2 - mn);
    m = mn;
}

__device__ __forceinline__ void add4(float& m, float& s, float4 v) {
    const float mn = fmaxf(fmaxf(m, fmaxf(v.x, v.y)), fmaxf(v.z, v.w));
    if (mn == -INFINITY) return;
    s = s * expf(m - mn) + (expf(v.x - mn) + expf(v.y - mn)) + (expf(v.z - mn) + expf(v.w - mn));
    m = mn;
}

__global__ void __launch_bounds__(THREADS) log_softmax_kernel(const float* __restrict__ x, float* __restrict__ y,
                                                              int64_t cols, bool vec) {
    __shared__ float part_m[THREADS / 32], part_s[THREADS / 32];
    const float* row = x + (int64_t)blockIdx.x * cols;
    float* out = y + (int64_t)blockIdx.x * cols;
    float m = -INFINITY, s = 0.f;
    if (vec) {
        const float4* row4 = reinterpret_cast<const float4*>(row);
        #pragma unroll 4
        for (int64_t c = threadIdx.x; c < cols / 4; c += THREADS) add4(m, s, row4[c]);
    } else {
        for (int64_t c = threadIdx.x; c < cols; c += THREADS) merge(m, s, row[c], 1.f);
    }
    for (int offset = 16; offset > 0; offset >>= 1)
        merge(m, s, __shfl_xor_sync(0xffffffff, m, offset), __shfl_xor_sync(0xffffffff, s, offset));
    if ((threadIdx.x & 31) == 0) { part_m[threadIdx.x >> 5] = m; part_s[threadIdx.x >> 5] = s; }
    __syncthreads();
    m = part_m[0]; s = part_s[0];
    for (int w = 1; w < THREADS / 32; ++w) merge(m, s, part_m[w], part_s[w]);
    const float lse = m + logf(s);
    if (vec) {
        const float4* row4 = reinterpret_cast<const float4*>(row);
        float4* out4 = reinterpret_cast<float4*>(out);
        #pragma unroll 4
        for (int64_t c = threadIdx.x; c < cols / 4; c += THREADS) {
            const float4 v = row4[c];
            out4[c] = make_float4(v.x - lse, v.y - lse, v.z - lse, v.w - lse);
        }
    } else {
        for (int64_t c = threadIdx.x; c < cols; c += THREADS) out[c] = row[c] - lse;
    }
}

torch::Tensor log_softmax_rows(torch::Tensor x) {
    TORCH_CHECK(x.is_cuda() && x.is_contiguous() && x.scalar_type() == torch::kFloat32, "expected contiguous fp32 CUDA");
    TORCH_CHECK(x.dim() >= 1, "expected at least one dimension");
    auto y = torch::empty_like(x);
    const int64_t cols = x.size(-1);
    if (x.numel() == 0) return y;
    const int64_t rows = x.numel() / cols;
    TORCH_CHECK(rows <= INT32_MAX, "too many rows");
    const bool vec = cols % 4 == 0 && reinterpret_cast<uintptr_t>(x.data_ptr<float>()) % 16 == 0;
    log_softmax_kernel<<<(unsigned)rows, THREADS>>>(x.data_ptr<float>(), y.data_ptr<float>(), cols, vec);
    const cudaError_t err = cudaGetLastError();
    TORCH_CHECK(err == cudaSuccess, "kernel launch failed: ", cudaGetErrorString(err));
    return y;
}
"""
log_softmax_ext = load_inline(name="log_softmax_online", cpp_sources="torch::Tensor log_softmax_rows(torch::Tensor x);",
                              cuda_sources=cuda_source, functions=["log_softmax_rows"], extra_cuda_cflags=["-O3"])


class ModelNew(torch.nn.Module):
    def forward(self, x):
        return log_softmax_ext.log_softmax_rows(x.contiguous())
