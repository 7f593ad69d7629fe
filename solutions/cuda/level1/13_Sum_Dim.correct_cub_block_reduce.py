"""Sum over the middle dimension: a block per 32-column strip, its threads' partial strips combined by cub::BlockReduce."""
import torch
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
#include <cub/cub.cuh>

constexpr int THREADS = 256;
constexpr int STRIP = 32;  // columns per block: one 128-byte line of every reduced row

// A thread's running sums of the strip's 32 columns; cub::BlockReduce sums these over the block's threads.
struct Strip {
    float4 q[STRIP / 4];
};

struct StripSum {
    __device__ __forceinline__ Strip operator()(const Strip& a, const Strip& b) const {
        Strip r;
        #pragma unroll
        for (int k = 0; k < STRIP / 4; ++k)
            r.q[k] = make_float4(a.q[k].x + b.q[k].x, a.q[k].y + b.q[k].y, a.q[k].z + b.q[k].z, a.q[k].w + b.q[k].w);
        return r;
    }
};

// x viewed as (outer, reduced, inner); block (strip, o) sums rows 0..reduced-1 of columns
// [strip * 32, strip * 32 + 32) of slice o. Thread t takes rows t, t + 256, ...: each row's strip is one line.
__global__ void __launch_bounds__(THREADS) sum_dim_kernel(const float* __restrict__ x, float* __restrict__ out,
                                                          int reduced, int inner) {
    using BlockReduce = cub::BlockReduce<Strip, THREADS>;
    __shared__ typename BlockReduce::TempStorage temp;
    const int64_t o = blockIdx.y;
    const int col = blockIdx.x * STRIP;
    Strip acc;
    #pragma unroll
    for (int k = 0; k < STRIP / 4; ++k) acc.q[k] = make_float4(0.f, 0.f, 0.f, 0.f);
    const float* base = x + o * reduced * (int64_t)inner + col;
    for (int r = threadIdx.x; r < reduced; r += THREADS) {
        const float4* line = reinterpret_cast<const float4*>(base + (int64_t)r * inner);
        #pragma unroll
        for (int k = 0; k < STRIP / 4; ++k) {
            const float4 v = __ldg(line + k);
            acc.q[k].x += v.x; acc.q[k].y += v.y; acc.q[k].z += v.z; acc.q[k].w += v.w;
        }
    }
    const Strip total = BlockReduce(temp).Reduce(acc, StripSum());
    if (threadIdx.x == 0) {
        float4* dst = reinterpret_cast<float4*>(out + o * (int64_t)inner + col);
        #pragma unroll
        for (int k = 0; k < STRIP / 4; ++k) dst[k] = total.q[k];
    }
}

torch::Tensor sum_dim(torch::Tensor x, int64_t dim) {
    TORCH_CHECK(x.is_cuda() && x.is_contiguous() && x.scalar_type() == torch::kFloat32, "expected contiguous fp32 CUDA");
    dim = dim < 0 ? dim + x.dim() : dim;
    TORCH_CHECK(dim >= 0 && dim < x.dim(), "dim out of range");
    int64_t outer = 1, inner = 1;
    for (int64_t d = 0; d < dim; ++d) outer *= x.size(d);
    for (int64_t d = dim + 1; d < x.dim(); ++d) inner *= x.size(d);
    const int64_t reduced = x.size(dim);
    TORCH_CHECK(inner % STRIP == 0 && outer < 65536 && reduced < (1LL << 31) && inner < (1LL << 31),
                "this kernel wants the inner size a multiple of 32 and fewer than 65536 outer slices");
    auto sizes = x.sizes().vec();
    sizes[dim] = 1;
    auto out = torch::empty(sizes, x.options());
    if (out.numel() == 0) return out;
    sum_dim_kernel<<<dim3((unsigned)(inner / STRIP), (unsigned)outer), THREADS>>>(
        x.data_ptr<float>(), out.data_ptr<float>(), (int)reduced, (int)inner);
    TORCH_CHECK(cudaGetLastError() == cudaSuccess, "sum kernel launch failed");
    return out;
}
"""
sum_ext = load_inline(name="sum_dim_cub_block_reduce", cpp_sources="torch::Tensor sum_dim(torch::Tensor x, int64_t dim);",
                      cuda_sources=cuda_source, functions=["sum_dim"], extra_cuda_cflags=["-O3"])


class ModelNew(torch.nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.dim = dim

    def forward(self, x):
        return sum_ext.sum_dim(x.contiguous(), self.dim)
