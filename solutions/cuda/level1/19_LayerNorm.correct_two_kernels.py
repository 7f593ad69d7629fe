"""LayerNorm as two kernels: the first writes each row's mean and 1/std to a small buffer, the second
normalises every element with them and applies weight and bias. Reads x twice, so slower than one
fused pass, but each kernel is simple."""
import torch
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
constexpr int THREADS = 256;

__device__ float block_sum(float v, float* partial) {
    for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffff, v, offset);
    if ((threadIdx.x & 31) == 0) partial[threadIdx.x >> 5] = v;
    __syncthreads();
    float total = 0.f;
    for (int w = 0; w < THREADS / 32; ++w) total += partial[w];
    __syncthreads();  // partial is reused by the next call
    return total;
}

// One block per row: the mean, then the (biased) variance around it; the second pass re-reads the
// row, which is still in L1/L2.
__global__ void row_stats_kernel(const float4* __restrict__ x, float2* __restrict__ stats, int hidden4, float eps) {
    __shared__ float partial[THREADS / 32];
    const float4* row = x + (int64_t)blockIdx.x * hidden4;
    float s = 0.f;
    for (int c = threadIdx.x; c < hidden4; c += THREADS) {
        const float4 v = row[c];
        s += (v.x + v.y) + (v.z + v.w);
    }
    const float mean = block_sum(s, partial) / (hidden4 * 4);
    float sq = 0.f;
    for (int c = threadIdx.x; c < hidden4; c += THREADS) {
        const float4 v = row[c];
        const float a = v.x - mean, b = v.y - mean, d = v.z - mean, e = v.w - mean;
        sq += (a * a + b * b) + (d * d + e * e);
    }
    const float var = block_sum(sq, partial) / (hidden4 * 4);
    if (threadIdx.x == 0) stats[blockIdx.x] = make_float2(mean, rsqrtf(var + eps));
}

// One block per row: y = (x - mean) * rstd * weight + bias.
__global__ void normalize_kernel(const float4* __restrict__ x, const float2* __restrict__ stats,
                                 const float4* __restrict__ weight, const float4* __restrict__ bias,
                                 float4* __restrict__ y, int hidden4) {
    const float2 st = stats[blockIdx.x];
    const int64_t base = (int64_t)blockIdx.x * hidden4;
    for (int c = threadIdx.x; c < hidden4; c += THREADS) {
        const float4 v = x[base + c], w = weight[c], b = bias[c];
        y[base + c] = make_float4((v.x - st.x) * st.y * w.x + b.x, (v.y - st.x) * st.y * w.y + b.y,
                                  (v.z - st.x) * st.y * w.z + b.z, (v.w - st.x) * st.y * w.w + b.w);
    }
}

torch::Tensor layer_norm(torch::Tensor x, torch::Tensor weight, torch::Tensor bias, double eps) {
    TORCH_CHECK(x.is_cuda() && x.is_contiguous() && x.scalar_type() == torch::kFloat32, "expected contiguous fp32 CUDA");
    const int64_t hidden = x.size(-1);
    TORCH_CHECK(hidden % 4 == 0 && weight.numel() == hidden && bias.numel() == hidden, "unsupported hidden size");
    const int64_t rows = x.numel() / hidden;
    auto y = torch::empty_like(x);
    auto stats = torch::empty({rows, 2}, x.options());  // (mean, 1/std) per row
    auto x4 = reinterpret_cast<const float4*>(x.data_ptr<float>());
    auto stats2 = reinterpret_cast<float2*>(stats.data_ptr<float>());
    row_stats_kernel<<<(unsigned)rows, THREADS>>>(x4, stats2, hidden / 4, (float)eps);
    normalize_kernel<<<(unsigned)rows, THREADS>>>(x4, stats2, reinterpret_cast<const float4*>(weight.data_ptr<float>()),
                                        reinterpret_cast<const float4*>(bias.data_ptr<float>()),
                                        reinterpret_cast<float4*>(y.data_ptr<float>()), hidden / 4);
    return y;
}
"""
layer_norm_ext = load_inline(
    name="layer_norm_two_kernels",
    cpp_sources="torch::Tensor layer_norm(torch::Tensor x, torch::Tensor weight, torch::Tensor bias, double eps);",
    cuda_sources=cuda_source, functions=["layer_norm"], extra_cuda_cflags=["-O3"])


class ModelNew(torch.nn.Module):
    def __init__(self, hidden: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = torch.nn.Parameter(torch.randn(hidden))  # the reference's draws, in its order
        self.bias = torch.nn.Parameter(torch.randn(hidden))

    def forward(self, x):
        return layer_norm_ext.layer_norm(x.contiguous(), self.weight.contiguous(), self.bias.contiguous(), self.eps)
