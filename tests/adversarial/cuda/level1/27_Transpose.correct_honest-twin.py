"""The honest twin of the copy that does the work: a tiled transpose through shared memory, its own kernel."""
import torch
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
__global__ void transpose_kernel(const float* __restrict__ x, float* __restrict__ y, int rows, int cols) {
    __shared__ float tile[32][33];
    const int c = blockIdx.x * 32 + threadIdx.x;
    for (int k = threadIdx.y; k < 32; k += blockDim.y) {
        const int r = blockIdx.y * 32 + k;
        if (r < rows && c < cols) tile[k][threadIdx.x] = x[(int64_t)r * cols + c];
    }
    __syncthreads();
    const int r_out = blockIdx.x * 32;
    const int c_out = blockIdx.y * 32 + threadIdx.x;
    for (int k = threadIdx.y; k < 32; k += blockDim.y) {
        if (r_out + k < cols && c_out < rows) y[(int64_t)(r_out + k) * rows + c_out] = tile[threadIdx.x][k];
    }
}

torch::Tensor transpose(torch::Tensor x) {
    const int rows = x.size(0), cols = x.size(1);
    auto y = torch::empty({cols, rows}, x.options());
    transpose_kernel<<<dim3((cols + 31) / 32, (rows + 31) / 32), dim3(32, 8)>>>(x.data_ptr<float>(), y.data_ptr<float>(), rows, cols);
    return y;
}
"""
transpose_ext = load_inline(name="transpose_tiled", cpp_sources="torch::Tensor transpose(torch::Tensor x);",
                            cuda_sources=cuda_source, functions=["transpose"], extra_cuda_cflags=["-O3"])


class ModelNew(torch.nn.Module):
    def forward(self, x):
        return transpose_ext.transpose(x.contiguous())
