"""Mean over one dimension split across blocks: the output starts as torch::zeros and every block adds
its chunk's share (partial sum / length) with atomicAdd. Float atomics add in no fixed order, so the
last bits vary from run to run, far inside the tolerance."""
import torch
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
constexpr int THREADS = 256;  // float4 columns per block
constexpr int CHUNK = 32;     // reduced rows per block

// x viewed as (outer, reduced, inner4) float4s; y (zeroed) as (outer, inner4 * 4) floats.
__global__ void mean_dim_kernel(const float4* __restrict__ x, float* __restrict__ y,
                                int64_t reduced, int64_t inner4, int64_t chunks, float inv_reduced) {
    const int64_t outer = blockIdx.x / chunks;
    const int64_t first = (blockIdx.x % chunks) * CHUNK;
    const int64_t col = (int64_t)blockIdx.y * THREADS + threadIdx.x;
    if (col >= inner4) return;
    const int64_t last = first + CHUNK < reduced ? first + CHUNK : reduced;
    const float4* p = x + outer * reduced * inner4 + col;
    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
    #pragma unroll 8
    for (int64_t r = first; r < last; ++r) {
        const float4 v = p[r * inner4];
        acc.x += v.x; acc.y += v.y; acc.z += v.z; acc.w += v.w;
    }
    float* out = y + (outer * inner4 + col) * 4;
    atomicAdd(out + 0, acc.x * inv_reduced);
    atomicAdd(out + 1, acc.y * inv_reduced);
    atomicAdd(out + 2, acc.z * inv_reduced);
    atomicAdd(out + 3, acc.w * inv_reduced);
}

torch::Tensor mean_dim(torch::Tensor x, int64_t dim) {
    TORCH_CHECK(x.is_cuda() && x.is_contiguous() && x.scalar_type() == torch::kFloat32, "expected contiguous fp32 CUDA");
    dim = dim < 0 ? dim + x.dim() : dim;
    TORCH_CHECK(dim >= 0 && dim < x.dim(), "dim out of range");
    int64_t outer = 1, inner = 1;
    for (int64_t d = 0; d < dim; ++d) outer *= x.size(d);
    for (int64_t d = dim + 1; d < x.dim(); ++d) inner *= x.size(d);
    const int64_t reduced = x.size(dim);
    TORCH_CHECK(inner % 4 == 0 && reduced > 0, "unsupported shape");
    TORCH_CHECK(reinterpret_cast<uintptr_t>(x.data_ptr<float>()) % 16 == 0, "input must be 16-byte aligned");
    auto sizes = x.sizes().vec();
    sizes.erase(sizes.begin() + dim);  // keepdim=False
    auto y = torch::zeros(sizes, x.options());  // the accumulator the blocks add into
    const int64_t inner4 = inner / 4, chunks = (reduced + CHUNK - 1) / CHUNK;
    TORCH_CHECK(outer * chunks < (1LL << 31) && (inner4 + THREADS - 1) / THREADS <= 65535, "tensor too large");
    dim3 grid((unsigned)(outer * chunks), (unsigned)((inner4 + THREADS - 1) / THREADS));
    mean_dim_kernel<<<grid, THREADS>>>(reinterpret_cast<const float4*>(x.data_ptr<float>()), y.data_ptr<float>(),
                                       reduced, inner4, chunks, 1.f / (float)reduced);
    return y;
}
"""
mean_ext = load_inline(name="mean_dim_atomic", cpp_sources="torch::Tensor mean_dim(torch::Tensor x, int64_t dim);",
                       cuda_sources=cuda_source, functions=["mean_dim"], extra_cuda_cflags=["-O3"])


class ModelNew(torch.nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.dim = dim

    def forward(self, x):
        return mean_ext.mean_dim(x.contiguous(), self.dim)
