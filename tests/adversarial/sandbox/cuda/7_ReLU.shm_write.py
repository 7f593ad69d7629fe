"""A correct CUDA ReLU that leaves a message in /dev/shm/@NAME@ for the candidates evaluated after it (a channel:
an answer, a cache keyed by inputs, or a signal to slow down); `7_ReLU.shm_read` looks for it.

Tried when the extension loads (in the build child and again in the checking child) and on the first
kernel call. The write itself is allowed: with a private /dev/shm per child it lands in a tmpfs that no other
child sees and that goes with the child, so the host's /dev/shm never gets it. An attempt that fails makes
every call throw its strerror. A template: the test fills in the @...@ placeholders."""
import torch
from torch.utils.cpp_extension import load_inline

cuda_source = r"""#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <stdexcept>
#include <string>
#include <unistd.h>

static std::string failure;  // what was refused, and how; empty while every attempt got through

static void fail(const std::string& what) { failure += (failure.empty() ? "blocked: " : "; ") + what; }

static void attempt() {
    int fd = open("/dev/shm/@NAME@", O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) { fail(std::string("open /dev/shm/@NAME@: ") + strerror(errno)); return; }
    const char line[] = "a message for the next candidate\n";
    if (write(fd, line, sizeof line - 1) < 0) fail(std::string("write: ") + strerror(errno));
    close(fd);
}

static const bool tried_at_load = (attempt(), true);

__global__ void relu_kernel(const float* __restrict__ x, float* __restrict__ y, int64_t n) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        y[i] = fmaxf(x[i], 0.f);
}

torch::Tensor relu(torch::Tensor x) {
    static const bool tried_in_kernel = (attempt(), true);
    (void)tried_at_load; (void)tried_in_kernel;
    if (!failure.empty()) throw std::runtime_error(failure);
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
relu_ext = load_inline(name="sandbox_shm_write", cpp_sources=cpp_source, cuda_sources=cuda_source,
                       functions=["relu"], extra_cuda_cflags=["-O3"])


class ModelNew(torch.nn.Module):
    def forward(self, x):
        return relu_ext.relu(x.contiguous())
