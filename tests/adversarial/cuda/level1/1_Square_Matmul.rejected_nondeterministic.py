"""C = A @ B, the 32x32 tiled kernel of solutions/ without its second __syncthreads(): a real race, not a trick.

Warp w of a block stores row w of the B tile, which every warp reads at k = w. Without the barrier after the
products, a warp that is done with tile t goes on to store its row of tile t + 1 while slower warps of its
block still read tile t there, and they multiply by the wrong value. Why it shows on an H200 almost surely:
a block is 32 warps (1,024 threads), two blocks per SM, 16 warps per scheduler, so one warp can finish a
tile's 32 products many hundreds of cycles before the last of its block, which is longer than its loads of
the next tile take when they hit L2; over 128 tiles, 256 blocks at once and 16,384 blocks in all, millions
of products are exposed and some are hit in every run, at places that change with how warps are scheduled.
The repeated runs on the same inputs (the last beside a busy kernel, which shifts the scheduling again) then
differ by ~1 on outputs of ~60-300: far beyond the repeat tolerance, though often within atol = rtol = 1e-2
of the reference."""
import torch
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
constexpr int TILE = 32;

__global__ void matmul_racy_kernel(const float* __restrict__ A, const float* __restrict__ B, float* __restrict__ C,
                                   int N) {
    __shared__ float As[TILE][TILE];
    __shared__ float Bs[TILE][TILE];
    const int tx = threadIdx.x, ty = threadIdx.y;
    const int row = blockIdx.y * TILE + ty, col = blockIdx.x * TILE + tx;
    float acc = 0.f;
    for (int k0 = 0; k0 < N; k0 += TILE) {
        As[ty][tx] = A[(int64_t)row * N + k0 + tx];
        Bs[ty][tx] = B[(int64_t)(k0 + ty) * N + col];
        __syncthreads();
        #pragma unroll
        for (int k = 0; k < TILE; ++k) acc += As[ty][k] * Bs[k][tx];
        // missing: __syncthreads();
    }
    C[(int64_t)row * N + col] = acc;
}

torch::Tensor matmul(torch::Tensor a, torch::Tensor b) {
    TORCH_CHECK(a.is_cuda() && a.scalar_type() == torch::kFloat32, "expected fp32 CUDA");
    const int N = a.size(0);
    TORCH_CHECK(a.size(1) == N && b.size(0) == N && b.size(1) == N && N % TILE == 0, "square, a multiple of 32");
    auto c = torch::empty({N, N}, a.options());
    matmul_racy_kernel<<<dim3(N / TILE, N / TILE), dim3(TILE, TILE)>>>(
        a.data_ptr<float>(), b.data_ptr<float>(), c.data_ptr<float>(), N);
    return c;
}
"""
matmul_ext = load_inline(name="matmul_racy", cpp_sources="torch::Tensor matmul(torch::Tensor a, torch::Tensor b);",
                         cuda_sources=cuda_source, functions=["matmul"], extra_cuda_cflags=["-O3"])


class ModelNew(torch.nn.Module):
    def forward(self, a, b):
        return matmul_ext.matmul(a.contiguous(), b.contiguous())
