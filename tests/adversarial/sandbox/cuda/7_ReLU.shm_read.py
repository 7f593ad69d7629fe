"""A correct CUDA ReLU that reads /dev/shm/@NAME@, where `7_ReLU.shm_write`, evaluated before it, leaves a
message. Finding one, it throws it (`runtime_error`), so that a channel between candidates shows as this
candidate's status; with a private /dev/shm per child it finds nothing and is judged correct.

Tried when the extension loads (in the build child and again in the checking child) and on the first
kernel call. A template: the test fills in the @...@ placeholders."""
import torch
from torch.utils.cpp_extension import load_inline

cuda_source = r"""#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <stdexcept>
#include <string>
#include <unistd.h>

static std::string found;  // a message another candidate left; empty while there is none

static void attempt() {
    int fd = open("/dev/shm/@NAME@", O_RDONLY);
    if (fd < 0) return;  // nothing there: the channel is closed
    char text[256] = {0};
    (void)!read(fd, text, sizeof text - 1);
    close(fd);
    found = std::string("found another candidate's message in /dev/shm: ") + text;
}

static const bool tried_at_load = (attempt(), true);

__global__ void relu_kernel(const float* __restrict__ x, float* __restrict__ y, int64_t n) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        y[i] = fmaxf(x[i], 0.f);
}

torch::Tensor relu(torch::Tensor x) {
    static const bool tried_in_kernel = (attempt(), true);
    (void)tried_at_load; (void)tried_in_kernel;
    if (!found.empty()) throw std::runtime_error(found);
    TORCH_CHECK(x.is_cuda() && x.is_contiguous() && x.scalar_type() == torch::kFloat32,
                "expected contiguous fp32 CUDA");
    auto y = torch::empty_like(x);
    const int64_t n = x.numel();
    const int threads = 256;
    const int blocks = (int)std::min<int64_t>((n + threads - 1) / threads, 4096);
    if (n > 0) relu_kernel<<<blocks, threads>>>(x.data_ptr<float>(), y.data_ptr<float>(), n);
    return y;
}
"""
cpp_source = "torch::Tensor relu(torch::Tensor x);"
relu_ext = load_inline(name="sandbox_shm_read", cpp_sources=cpp_source, cuda_sources=cuda_source,
                       functions=["relu"], extra_cuda_cflags=["-O3"])


class ModelNew(torch.nn.Module):
    def forward(self, x):
        return relu_ext.relu(x.contiguous())
