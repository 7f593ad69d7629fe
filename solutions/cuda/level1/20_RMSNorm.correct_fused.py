"""RMSNorm in one kernel: a block per row keeps the row in registers, so memory is read once and written once."""
import torch
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
constexpr int THREADS = 256;
constexpr int MAX_VECS = 8;  // float4s per thread: rows up to 8192 wide

__device__ float block_sum(float v) {
    __shared__ float partial[THREADS / 32];
    for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffff, v, offset);
    if ((threadIdx.x & 31) == 0) partial[threadIdx.x >> 5] = v;
    __syncthreads();
    v = 0.f;
    for (int w = 0; w < THREADS / 32; ++w) v += partial[w];
    return v;
}

__global__ void rmsnorm_kernel(const float4* __restrict__ x, const float4* __restrict__ weight,
                               float4* __restrict__ y, int vecs_per_row, float eps) {
    const float4* row = x + (int64_t)blockIdx.x * vecs_per_row;
    float4 v[MAX_VECS];
    float squares = 0.f;
    #pragma unroll
    for (int j = 0; j < MAX_VECS; ++j) {
        int c = threadIdx.x + j * THREADS;
        if (c < vecs_per_row) {
            v[j] = row[c];
            squares += v[j].x * v[j].x + v[j].y * v[j].y + v[j].z * v[j].z + v[j].w * v[j].w;
        }
    }
    const float scale = rsqrtf(block_sum(squares) / (vecs_per_row * 4) + eps);
    float4* out = y + (int64_t)blockIdx.x * vecs_per_row;
    #pragma unroll
    for (int j = 0; j < MAX_VECS; ++j) {
        int c = threadIdx.x + j * THREADS;
        if (c < vecs_per_row) {
            float4 w = weight[c];
            out[c] = make_float4(v[j].x * scale * w.x, v[j].y * scale * w.y, v[j].z * scale * w.z, v[j].w * scale * w.w);
        }
    }
}

torch::Tensor rmsnorm(torch::Tensor x, torch::Tensor weight, double eps) {
    TORCH_CHECK(x.is_cuda() && x.is_contiguous() && x.scalar_type() == torch::kFloat32, "expected contiguous fp32 CUDA");
    const int64_t hidden = x.size(-1);
    TORCH_CHECK(hidden % 4 == 0 && hidden / 4 <= THREADS * MAX_VECS, "unsupported hidden size");
    auto y = torch::empty_like(x);
    const int64_t rows = x.numel() / hidden;
    rmsnorm_kernel<<<rows, THREADS>>>(reinterpret_cast<const float4*>(x.data_ptr<float>()),
                                      reinterpret_cast<const float4*>(weight.data_ptr<float>()),
                                      reinterpret_cast<float4*>(y.data_ptr<float>()), hidden / 4, (float)eps);
    return y;
}
"""
rmsnorm_ext = load_inline(name="rmsnorm_fused",
                          cpp_sources="torch::Tensor rmsnorm(torch::Tensor x, torch::Tensor weight, double eps);",
                          cuda_sources=cuda_source, functions=["rmsnorm"], extra_cuda_cflags=["-O3"])


class ModelNew(torch.nn.Module):
    def __init__(self, hidden: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = torch.nn.Parameter(torch.randn(hidden))

    def forward(self, x):
        return rmsnorm_ext.rmsnorm(x.contiguous(), self.weight.contiguous(), self.eps)
