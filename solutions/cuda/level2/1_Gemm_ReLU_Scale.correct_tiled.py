"""relu(x @ W^T + b) * scale in one kernel: a 64x64 shared-memory tiled SGEMM with the epilogue fused.

Slower than cuBLAS (no tensor cores, no double buffering) but a correct baseline to improve on."""
import math

import torch
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
constexpr int BM = 64, BN = 64, BK = 16, THREADS = 256;

// C[m][n] = sum_k X[m][k] * W[n][k]; each thread computes a 4x4 patch of the 64x64 tile.
__global__ void gemm_relu_scale_kernel(const float* __restrict__ X, const float* __restrict__ W,
                                       const float* __restrict__ bias, float* __restrict__ C,
                                       int M, int N, int K, float scale) {
    __shared__ float As[BK][BM + 4];
    __shared__ float Bs[BK][BN + 4];
    const int tid = threadIdx.x;
    const int row0 = blockIdx.y * BM, col0 = blockIdx.x * BN;
    const int load_row = tid / 4, load_k = (tid % 4) * 4;
    const int ty = tid / 16, tx = tid % 16;
    float acc[4][4] = {};
    for (int k0 = 0; k0 < K; k0 += BK) {
        float4 a = *reinterpret_cast<const float4*>(X + (int64_t)(row0 + load_row) * K + k0 + load_k);
        float4 b = *reinterpret_cast<const float4*>(W + (int64_t)(col0 + load_row) * K + k0 + load_k);
        As[load_k + 0][load_row] = a.x; As[load_k + 1][load_row] = a.y;
        As[load_k + 2][load_row] = a.z; As[load_k + 3][load_row] = a.w;
        Bs[load_k + 0][load_row] = b.x; Bs[load_k + 1][load_row] = b.y;
        Bs[load_k + 2][load_row] = b.z; Bs[load_k + 3][load_row] = b.w;
        __syncthreads();
        #pragma unroll
        for (int k = 0; k < BK; ++k) {
            float ar[4], br[4];
            #pragma unroll
            for (int i = 0; i < 4; ++i) { ar[i] = As[k][ty * 4 + i]; br[i] = Bs[k][tx * 4 + i]; }
            #pragma unroll
            for (int i = 0; i < 4; ++i)
                #pragma unroll
                for (int j = 0; j < 4; ++j) acc[i][j] += ar[i] * br[j];
        }
        __syncthreads();
    }
    #pragma unroll
    for (int i = 0; i < 4; ++i) {
        const int r = row0 + ty * 4 + i;
        float4 out;
        float* o = reinterpret_cast<float*>(&out);
        #pragma unroll
        for (int j = 0; j < 4; ++j) o[j] = fmaxf(acc[i][j] + bias[col0 + tx * 4 + j], 0.f) * scale;
        *reinterpret_cast<float4*>(C + (int64_t)r * N + col0 + tx * 4) = out;
    }
}

torch::Tensor gemm_relu_scale(torch::Tensor x, torch::Tensor weight, torch::Tensor bias, double scale) {
    TORCH_CHECK(x.is_cuda() && x.scalar_type() == torch::kFloat32, "expected fp32 CUDA");
    const int M = x.size(0), K = x.size(1), N = weight.size(0);
    TORCH_CHECK(M % BM == 0 && N % BN == 0 && K % BK == 0, "sizes must be multiples of the tile");
    auto c = torch::empty({M, N}, x.options());
    gemm_relu_scale_kernel<<<dim3(N / BN, M / BM), THREADS>>>(
        x.data_ptr<float>(), weight.data_ptr<float>(), bias.data_ptr<float>(), c.data_ptr<float>(),
        M, N, K, (float)scale);
    return c;
}
"""
gemm_ext = load_inline(
    name="gemm_relu_scale",
    cpp_sources="torch::Tensor gemm_relu_scale(torch::Tensor x, torch::Tensor weight, torch::Tensor bias, double scale);",
    cuda_sources=cuda_source, functions=["gemm_relu_scale"], extra_cuda_cflags=["-O3"])


class ModelNew(torch.nn.Module):
    def __init__(self, in_features: int, out_features: int, scale: float):
        super().__init__()
        # The same draws, in the same order, as nn.Linear's own initialisation.
        self.weight = torch.nn.Parameter(torch.empty(out_features, in_features))
        self.bias = torch.nn.Parameter(torch.empty(out_features))
        torch.nn.init.kaiming_uniform_(self.weight, a=math.sqrt(5))
        bound = 1 / math.sqrt(in_features)
        torch.nn.init.uniform_(self.bias, -bound, bound)
        self.scale = scale

    def forward(self, x):
        return gemm_ext.gemm_relu_scale(x.contiguous(), self.weight.contiguous(), self.bias, self.scale)
