"""(leaky_relu(x @ W^T + b) + x) * scale in one kernel: a 128x128 shared-memory tiled SGEMM, 8x8 outputs per
thread, with the bias, leaky ReLU, residual add and scale fused into the epilogue (the residual needs
in_features == out_features, as in the task).

No tensor cores and no double buffering: slower than cuBLAS, but one kernel and no extra passes."""
import math

import torch
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
constexpr int BM = 128, BN = 128, BK = 8, THREADS = 256;

// Y[m][n] = (leaky(sum_k X[m][k] * W[n][k] + b[n]) + X[m][n]) * scale. Threads form a 16x16 grid; thread
// (ty, tx) owns rows {ty*4 .. ty*4+3, 64+ty*4 .. 64+ty*4+3} and the same pattern of columns with tx, so the
// float4 reads of a warp from shared memory cover 64 consecutive floats without bank conflicts.
// The launch bounds hold it to 128 registers (no spills on sm_90), so two blocks share an SM.
__global__ void __launch_bounds__(THREADS, 2) gemm_leaky_residual_kernel(
        const float* __restrict__ X, const float* __restrict__ W, const float* __restrict__ bias,
        float* __restrict__ Y, int64_t N, int64_t K, float slope, float scale) {
    __shared__ __align__(16) float As[BK][BM];  // X tile, transposed: As[k][m]
    __shared__ __align__(16) float Bs[BK][BN];  // W tile, transposed: Bs[k][n]
    const int tid = threadIdx.x;
    const int tx = tid % 16, ty = tid / 16;
    const int64_t row0 = (int64_t)blockIdx.y * BM, col0 = (int64_t)blockIdx.x * BN;
    const int load_row = tid / 2, load_k = (tid % 2) * 4;  // each thread loads one float4 of each tile
    const float* a_src = X + (row0 + load_row) * K + load_k;
    const float* b_src = W + (col0 + load_row) * K + load_k;
    float acc[8][8] = {};
    for (int64_t k0 = 0; k0 < K; k0 += BK) {
        const float4 a = *reinterpret_cast<const float4*>(a_src + k0);
        const float4 b = *reinterpret_cast<const float4*>(b_src + k0);
        As[load_k + 0][load_row] = a.x; As[load_k + 1][load_row] = a.y;
        As[load_k + 2][load_row] = a.z; As[load_k + 3][load_row] = a.w;
        Bs[load_k + 0][load_row] = b.x; Bs[load_k + 1][load_row] = b.y;
        Bs[load_k + 2][load_row] = b.z; Bs[load_k + 3][load_row] = b.w;
        __syncthreads();
        #pragma unroll
        for (int k = 0; k < BK; ++k) {
            float ar[8], br[8];
            *reinterpret_cast<float4*>(ar) = *reinterpret_cast<const float4*>(&As[k][ty * 4]);
            *reinterpret_cast<float4*>(ar + 4) = *reinterpret_cast<const float4*>(&As[k][64 + ty * 4]);
            *reinterpret_cast<float4*>(br) = *reinterpret_cast<const float4*>(&Bs[k][tx * 4]);
            *reinterpret_cast<float4*>(br + 4) = *reinterpret_cast<const float4*>(&Bs[k][64 + tx * 4]);
            #pragma unroll
            for (int i = 0; i < 8; ++i)
                #pragma unroll
                for (int j = 0; j < 8; ++j) acc[i][j] = fmaf(ar[i], br[j], acc[i][j]);
        }
        __syncthreads();
    }
    #pragma unroll
    for (int i = 0; i < 8; ++i) {
        const int64_t r = row0 + (i / 4) * 64 + ty * 4 + i % 4;
        #pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int64_t c = col0 + h * 64 + tx * 4;
            const float4 b4 = *reinterpret_cast<const float4*>(bias + c);
            const float4 x4 = *reinterpret_cast<const float4*>(X + r * K + c);  // residual: K == N
            const float bb[4] = {b4.x, b4.y, b4.z, b4.w}, xr[4] = {x4.x, x4.y, x4.z, x4.w};
            float o[4];
            #pragma unroll
            for (int j = 0; j < 4; ++j) {
                const float v = acc[i][h * 4 + j] + bb[j];
                o[j] = ((v > 0.f ? v : v * slope) + xr[j]) * scale;
            }
            *reinterpret_cast<float4*>(Y + r * N + c) = make_float4(o[0], o[1], o[2], o[3]);
        }
    }
}

torch::Tensor gemm_leaky_residual(torch::Tensor x, torch::Tensor weight, torch::Tensor bias,
                                  double negative_slope, double scale) {
    for (const auto& t : {x, weight, bias})
        TORCH_CHECK(t.is_cuda() && t.is_contiguous() && t.scalar_type() == torch::kFloat32, "expected contiguous fp32 CUDA");
    TORCH_CHECK(x.dim() == 2 && weight.dim() == 2 && bias.dim() == 1, "expected x (M, K), weight (N, K), bias (N)");
    const int64_t M = x.size(0), K = x.size(1), N = weight.size(0);
    TORCH_CHECK(weight.size(1) == K && bias.size(0) == N && N == K, "the residual add needs weight (K, K) and bias (K)");
    TORCH_CHECK(M % BM == 0 && N % BN == 0 && K % BK == 0, "M and N must be multiples of 128, K of 8");
    TORCH_CHECK(M / BM <= 65535, "too many rows");
    auto y = torch::empty({M, N}, x.options());
    if (M == 0 || N == 0) return y;
    gemm_leaky_residual_kernel<<<dim3((unsigned)(N / BN), (unsigned)(M / BM)), THREADS>>>(
        x.data_ptr<float>(), weight.data_ptr<float>(), bias.data_ptr<float>(), y.data_ptr<float>(),
        N, K, (float)negative_slope, (float)scale);
    const cudaError_t err = cudaGetLastError();
    TORCH_CHECK(err == cudaSuccess, "kernel launch failed: ", cudaGetErrorString(err));
    return y;
}
"""
gemm_ext = load_inline(
    name="gemm_leaky_residual_scale",
    cpp_sources="torch::Tensor gemm_leaky_residual(torch::Tensor x, torch::Tensor weight, torch::Tensor bias, "
                "double negative_slope, double scale);",
    cuda_sources=cuda_source, functions=["gemm_leaky_residual"], extra_cuda_cflags=["-O3"])


class ModelNew(torch.nn.Module):
    def __init__(self, hidden: int, negative_slope: float, scale: float):
        super().__init__()
        # nn.Linear's parameters under its names (linear.weight, linear.bias), drawn in its order.
        self.linear = torch.nn.Module()
        self.linear.weight = torch.nn.Parameter(torch.empty(hidden, hidden))
        self.linear.bias = torch.nn.Parameter(torch.empty(hidden))
        torch.nn.init.kaiming_uniform_(self.linear.weight, a=math.sqrt(5))
        bound = 1 / math.sqrt(hidden)
        torch.nn.init.uniform_(self.linear.bias, -bound, bound)
        self.negative_slope = negative_slope
        self.scale = scale

    def forward(self, x):
        return gemm_ext.gemm_leaky_residual(x.contiguous(), self.linear.weight.contiguous(), self.linear.bias,
                                            self.negative_slope, self.scale)
