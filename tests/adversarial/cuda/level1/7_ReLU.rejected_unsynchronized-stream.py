"""Runs ReLU on a non-blocking side stream and returns at once: the side stream waits for the input,
but the caller's current stream is never made to wait for the output, so anything timed or read on
the current stream sees an unfinished (here: NaN-poisoned) result."""
import torch
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
__global__ void relu_kernel(const float* __restrict__ x, float* __restrict__ y, int64_t n) {
    const int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (i < n) y[i] = fmaxf(x[i], 0.f);
}

torch::Tensor relu(torch::Tensor x, int64_t current_stream) {
    static cudaStream_t side = nullptr;
    static cudaEvent_t inputs_ready;
    if (side == nullptr) {
        cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking);
        cudaEventCreateWithFlags(&inputs_ready, cudaEventDisableTiming);
    }
    auto y = torch::empty_like(x);
    cudaEventRecord(inputs_ready, reinterpret_cast<cudaStream_t>(current_stream));
    cudaStreamWaitEvent(side, inputs_ready, 0);
    relu_kernel<<<(unsigned)((x.numel() + 255) / 256), 256, 0, side>>>(x.data_ptr<float>(), y.data_ptr<float>(), x.numel());
    return y;  // no join: the current stream does not wait for `side`
}
"""
relu_ext = load_inline(name="adv_cuda_side_stream", cpp_sources="torch::Tensor relu(torch::Tensor x, int64_t current_stream);",
                       cuda_sources=cuda_source, functions=["relu"], extra_cuda_cflags=["-O3"])


class ModelNew(torch.nn.Module):
    def forward(self, x):
        return relu_ext.relu(x.contiguous(), torch.cuda.current_stream(x.device).cuda_stream)
