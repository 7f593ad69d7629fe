"""Counts its calls: the checks come first (5 trials and 3 repeats, 8 calls), so from the 9th call on it
launches its ReLU on a non-blocking side stream that waits for nothing (a timed call's inputs are written
before the timer's window opens) and has the current stream wait for it. The kernel then starts while the
timer's L2 flush still runs, before the begin event: CUDA events alone would see little of it. The kernel log
counts it from its start (correct, at its honest twin's speed), or, where it ends before the begin event, the
events' few microseconds against the profiler's and the host's fraction of a millisecond are
`[clock-mismatch]`; on the H200 both have been seen."""
import torch
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
__global__ void relu_kernel(const float* __restrict__ x, float* __restrict__ y, int64_t n) {
    const int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (i < n) y[i] = fmaxf(x[i], 0.f);
}

torch::Tensor relu(torch::Tensor x, int64_t current_stream) {
    static cudaStream_t side = nullptr;
    static cudaEvent_t done;
    static int64_t calls = 0;
    if (side == nullptr) {
        cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking);
        cudaEventCreateWithFlags(&done, cudaEventDisableTiming);
    }
    auto current = reinterpret_cast<cudaStream_t>(current_stream);
    auto y = torch::empty_like(x);
    const unsigned blocks = (unsigned)((x.numel() + 255) / 256);
    if (++calls <= 8) {
        relu_kernel<<<blocks, 256, 0, current>>>(x.data_ptr<float>(), y.data_ptr<float>(), x.numel());
        return y;
    }
    relu_kernel<<<blocks, 256, 0, side>>>(x.data_ptr<float>(), y.data_ptr<float>(), x.numel());
    cudaEventRecord(done, side);
    cudaStreamWaitEvent(current, done, 0);  // joined: the output is ready for whoever reads it next
    return y;
}
"""
relu_ext = load_inline(name="adv_cuda_head_start", cpp_sources="torch::Tensor relu(torch::Tensor x, int64_t current_stream);",
                       cuda_sources=cuda_source, functions=["relu"], extra_cuda_cflags=["-O3"])


class ModelNew(torch.nn.Module):
    def forward(self, x):
        return relu_ext.relu(x.contiguous(), torch.cuda.current_stream(x.device).cuda_stream)
