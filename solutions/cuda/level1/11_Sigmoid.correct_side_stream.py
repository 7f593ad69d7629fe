"""Sigmoid as a fork and a join: the second half of the tensor on a non-blocking side stream, the first
on the caller's current stream, and the current stream waits for the side stream before returning.

Both events are what make a side stream legitimate: the side stream may not read the input before the
current stream has produced it, and whoever uses the output on the current stream must see it finished."""
import torch
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
__global__ void sigmoid_kernel(const float4* __restrict__ x, float4* __restrict__ y, int64_t n4) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n4; i += (int64_t)gridDim.x * blockDim.x) {
        const float4 v = x[i];
        y[i] = make_float4(1.f / (1.f + expf(-v.x)), 1.f / (1.f + expf(-v.y)),
                           1.f / (1.f + expf(-v.z)), 1.f / (1.f + expf(-v.w)));
    }
}

struct SideStream {
    cudaStream_t stream;
    cudaEvent_t forked, joined;
    SideStream() {
        TORCH_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) == cudaSuccess, "cannot create a stream");
        TORCH_CHECK(cudaEventCreateWithFlags(&forked, cudaEventDisableTiming) == cudaSuccess, "cannot create an event");
        TORCH_CHECK(cudaEventCreateWithFlags(&joined, cudaEventDisableTiming) == cudaSuccess, "cannot create an event");
    }
};

torch::Tensor sigmoid_forward(torch::Tensor x, int64_t current_stream) {
    TORCH_CHECK(x.is_cuda() && x.is_contiguous() && x.scalar_type() == torch::kFloat32, "expected contiguous fp32 CUDA");
    TORCH_CHECK(x.numel() % 4 == 0, "numel must be a multiple of 4");
    static SideStream side;  // made once, on the first call's device
    cudaStream_t current = reinterpret_cast<cudaStream_t>(current_stream);
    auto y = torch::empty_like(x);
    const int64_t n4 = x.numel() / 4, first = n4 / 2;
    auto x4 = reinterpret_cast<const float4*>(x.data_ptr<float>());
    auto y4 = reinterpret_cast<float4*>(y.data_ptr<float>());
    const int threads = 256;
    const int blocks = (int)std::max<int64_t>(1, std::min<int64_t>((first + threads - 1) / threads, 132 * 8));

    cudaEventRecord(side.forked, current);          // fork: x is ready once the current stream gets here
    cudaStreamWaitEvent(side.stream, side.forked, 0);
    sigmoid_kernel<<<blocks, threads, 0, side.stream>>>(x4 + first, y4 + first, n4 - first);
    sigmoid_kernel<<<blocks, threads, 0, current>>>(x4, y4, first);
    cudaEventRecord(side.joined, side.stream);      // join: the current stream goes on only after the side half
    cudaStreamWaitEvent(current, side.joined, 0);
    TORCH_CHECK(cudaGetLastError() == cudaSuccess, "kernel launch failed");
    return y;
}
"""
sigmoid_ext = load_inline(name="sigmoid_side_stream",
                          cpp_sources="torch::Tensor sigmoid_forward(torch::Tensor x, int64_t current_stream);",
                          cuda_sources=cuda_source, functions=["sigmoid_forward"], extra_cuda_cflags=["-O3"])


class ModelNew(torch.nn.Module):
    def forward(self, x):
        return sigmoid_ext.sigmoid_forward(x.contiguous(), torch.cuda.current_stream(x.device).cuda_stream)
