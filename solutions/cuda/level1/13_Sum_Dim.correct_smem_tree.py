"""Sum over one dimension: each block owns 128 output columns; 16 warps each sum a slice of the reduced
rows with 16-byte loads, then a shared-memory tree adds the 16 partial sums."""
import torch
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
constexpr int LANES = 32;   // float4 columns per block: 128 floats
constexpr int GROUPS = 16;  // row slices per block, one warp each

// x viewed as (outer, reduced, inner4) float4s; y as (outer, inner4).
__global__ void sum_dim_kernel(const float4* __restrict__ x, float4* __restrict__ y,
                               int64_t reduced, int64_t inner4) {
    __shared__ float4 partial[GROUPS][LANES];
    const int64_t outer = blockIdx.y;
    const int64_t col = (int64_t)blockIdx.x * LANES + threadIdx.x;
    const bool valid = col < inner4;
    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
    if (valid) {
        const float4* p = x + outer * reduced * inner4 + col;
        #pragma unroll 4
        for (int64_t r = threadIdx.y; r < reduced; r += GROUPS) {
            const float4 v = p[r * inner4];
            acc.x += v.x; acc.y += v.y; acc.z += v.z; acc.w += v.w;
        }
    }
    partial[threadIdx.y][threadIdx.x] = acc;
    __syncthreads();
    for (int half = GROUPS / 2; half > 0; half >>= 1) {  // tree: 16 -> 8 -> 4 -> 2 -> 1
        if (threadIdx.y < half) {
            const float4 o = partial[threadIdx.y + half][threadIdx.x];
            float4& m = partial[threadIdx.y][threadIdx.x];
            m.x += o.x; m.y += o.y; m.z += o.z; m.w += o.w;
        }
        __syncthreads();
    }
    if (threadIdx.y == 0 && valid) y[outer * inner4 + col] = partial[0][threadIdx.x];
}

torch::Tensor sum_dim(torch::Tensor x, int64_t dim) {
    TORCH_CHECK(x.is_cuda() && x.is_contiguous() && x.scalar_type() == torch::kFloat32, "expected contiguous fp32 CUDA");
    dim = dim < 0 ? dim + x.dim() : dim;
    TORCH_CHECK(dim >= 0 && dim < x.dim(), "dim out of range");
    int64_t outer = 1, inner = 1;
    for (int64_t d = 0; d < dim; ++d) outer *= x.size(d);
    for (int64_t d = dim + 1; d < x.dim(); ++d) inner *= x.size(d);
    TORCH_CHECK(inner % 4 == 0 && outer <= 65535, "unsupported shape");
    TORCH_CHECK(reinterpret_cast<uintptr_t>(x.data_ptr<float>()) % 16 == 0, "input must be 16-byte aligned");
    auto sizes = x.sizes().vec();
    sizes[dim] = 1;  // keepdim=True
    auto y = torch::empty(sizes, x.options());
    const int64_t inner4 = inner / 4;
    dim3 grid((unsigned)((inner4 + LANES - 1) / LANES), (unsigned)outer);
    sum_dim_kernel<<<grid, dim3(LANES, GROUPS)>>>(reinterpret_cast<const float4*>(x.data_ptr<float>()),
                                                  reinterpret_cast<float4*>(y.data_ptr<float>()), x.size(dim), inner4);
    return y;
}
"""
sum_ext = load_inline(name="sum_dim_smem_tree", cpp_sources="torch::Tensor sum_dim(torch::Tensor x, int64_t dim);",
                      cuda_sources=cuda_source, functions=["sum_dim"], extra_cuda_cflags=["-O3"])


class ModelNew(torch.nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.dim = dim

    def forward(self, x):
        return sum_ext.sum_dim(x.contiguous(), self.dim)
