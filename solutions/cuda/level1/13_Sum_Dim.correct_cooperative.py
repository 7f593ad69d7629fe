"""Sum over the middle dimension in one cooperative launch: row slices summed, a grid-wide sync, the slices added."""
import torch
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
#include <cooperative_groups.h>

namespace cg = cooperative_groups;

constexpr int THREADS = 256;
constexpr int SLICES = 32;  // each (outer, column) sum is split into this many row slices

// x viewed as (outer, reduced, inner4) in float4s. Phase 1: work item (o, s) sums rows of slice s of o into
// partial[o][s][:], the grid striding over items. grid.sync(). Phase 2: each output float4 adds up its
// SLICES partials in a fixed order (no atomics: the same inputs give the same bits).
__global__ void __launch_bounds__(THREADS) sum_dim_cooperative_kernel(const float4* __restrict__ x,
                                                                      float4* __restrict__ partial,
                                                                      float4* __restrict__ out,
                                                                      int outer, int reduced, int inner4) {
    cg::grid_group grid = cg::this_grid();
    const int items = outer * SLICES;
    for (int item = blockIdx.x; item < items; item += gridDim.x) {
        const int o = item / SLICES, s = item % SLICES;
        const int r0 = (int)((int64_t)reduced * s / SLICES), r1 = (int)((int64_t)reduced * (s + 1) / SLICES);
        const float4* base = x + (int64_t)o * reduced * inner4;
        for (int c = threadIdx.x; c < inner4; c += THREADS) {
            float4 a = make_float4(0.f, 0.f, 0.f, 0.f), b = a;
            int r = r0;
            for (; r + 1 < r1; r += 2) {  // two rows in flight per thread
                const float4 u = __ldg(base + (int64_t)r * inner4 + c);
                const float4 v = __ldg(base + (int64_t)(r + 1) * inner4 + c);
                a.x += u.x; a.y += u.y; a.z += u.z; a.w += u.w;
                b.x += v.x; b.y += v.y; b.z += v.z; b.w += v.w;
            }
            if (r < r1) {
                const float4 u = __ldg(base + (int64_t)r * inner4 + c);
                a.x += u.x; a.y += u.y; a.z += u.z; a.w += u.w;
            }
            partial[(int64_t)item * inner4 + c] = make_float4(a.x + b.x, a.y + b.y, a.z + b.z, a.w + b.w);
        }
    }
    grid.sync();  // every slice's partial sums are written and visible
    const int64_t outputs = (int64_t)outer * inner4;
    for (int64_t i = blockIdx.x * (int64_t)THREADS + threadIdx.x; i < outputs; i += (int64_t)gridDim.x * THREADS) {
        const int64_t o = i / inner4, c = i % inner4;
        const float4* p = partial + o * SLICES * inner4 + c;
        float4 t = make_float4(0.f, 0.f, 0.f, 0.f);
        #pragma unroll 8
        for (int s = 0; s < SLICES; ++s) {
            const float4 v = p[(int64_t)s * inner4];
            t.x += v.x; t.y += v.y; t.z += v.z; t.w += v.w;
        }
        out[i] = t;
    }
}

torch::Tensor sum_dim(torch::Tensor x, int64_t dim, int64_t stream_handle) {
    TORCH_CHECK(x.is_cuda() && x.is_contiguous() && x.scalar_type() == torch::kFloat32, "expected contiguous fp32 CUDA");
    dim = dim < 0 ? dim + x.dim() : dim;
    TORCH_CHECK(dim >= 0 && dim < x.dim(), "dim out of range");
    int64_t outer = 1, inner = 1;
    for (int64_t d = 0; d < dim; ++d) outer *= x.size(d);
    for (int64_t d = dim + 1; d < x.dim(); ++d) inner *= x.size(d);
    const int64_t reduced = x.size(dim);
    TORCH_CHECK(inner % 4 == 0 && outer * SLICES < (1LL << 31) && reduced < (1LL << 31) && inner < (1LL << 31),
                "this kernel wants the inner size a multiple of 4");
    auto sizes = x.sizes().vec();
    sizes[dim] = 1;
    auto out = torch::empty(sizes, x.options());
    if (out.numel() == 0) return out;
    auto partial = torch::empty({outer, SLICES, inner}, x.options());  // scratch, this call's own

    // A cooperative launch needs every block resident at once: at most what the occupancy calculator allows.
    int device = 0, sms = 0, per_sm = 0, cooperative = 0;
    TORCH_CHECK(cudaGetDevice(&device) == cudaSuccess, "cudaGetDevice failed");
    TORCH_CHECK(cudaDeviceGetAttribute(&cooperative, cudaDevAttrCooperativeLaunch, device) == cudaSuccess && cooperative,
                "the device does not support cooperative launches");
    TORCH_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) == cudaSuccess, "no SM count");
    TORCH_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, sum_dim_cooperative_kernel, THREADS, 0) == cudaSuccess
                && per_sm > 0, "no occupancy");
    const int blocks = (int)std::min<int64_t>((int64_t)sms * per_sm, outer * SLICES);

    const float4* xp = reinterpret_cast<const float4*>(x.data_ptr<float>());
    float4* pp = reinterpret_cast<float4*>(partial.data_ptr<float>());
    float4* op = reinterpret_cast<float4*>(out.data_ptr<float>());
    int outer_i = (int)outer, reduced_i = (int)reduced, inner4 = (int)(inner / 4);
    void* args[] = {&xp, &pp, &op, &outer_i, &reduced_i, &inner4};
    const cudaError_t err = cudaLaunchCooperativeKernel((const void*)sum_dim_cooperative_kernel, dim3(blocks), dim3(THREADS),
                                                        args, 0, reinterpret_cast<cudaStream_t>(stream_handle));
    TORCH_CHECK(err == cudaSuccess, "cooperative launch failed: ", cudaGetErrorString(err));
    return out;
}
"""
sum_ext = load_inline(name="sum_dim_cooperative",
                      cpp_sources="torch::Tensor sum_dim(torch::Tensor x, int64_t dim, int64_t stream_handle);",
                      cuda_sources=cuda_source, functions=["sum_dim"], extra_cuda_cflags=["-O3"])


class ModelNew(torch.nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.dim = dim

    def forward(self, x):
        return sum_ext.sum_dim(x.contiguous(), self.dim, torch.cuda.current_stream(x.device).cuda_stream)
