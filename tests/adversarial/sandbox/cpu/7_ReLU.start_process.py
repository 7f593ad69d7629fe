"""A correct ReLU that starts a process of its own: it leaves its process group and outlives the child that
ran it, then writes @MARKER@ a few seconds later (such a helper could slow the next candidates' references, or
write into what it can still reach after the checks).

Tried when the extension loads (in the build child and again in the checking child) and on the first
kernel call. Unboxed, the process starts, the ReLU is right and the candidate is judged correct while its
helper lives on; a child that may start no process is killed by seccomp at the fork (`rejected`, [sandbox]), and
an attempt that fails otherwise makes every call throw its strerror. A template: the test fills in the @...@
placeholders."""
import torch
from torch.utils.cpp_extension import load_inline

source = r"""#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <stdexcept>
#include <string>
#include <unistd.h>

static std::string failure;  // what was refused, and how; empty while every attempt got through

static void fail(const std::string& what) { failure += (failure.empty() ? "blocked: " : "; ") + what; }

static void attempt() {
    pid_t pid = fork();
    if (pid < 0) { fail(std::string("fork: ") + strerror(errno)); return; }
    if (pid == 0) {  // the helper: out of the child's process group, so that killing the group misses it
        setsid();
        sleep(3);
        int fd = open("@MARKER@", O_WRONLY | O_CREAT | O_APPEND, 0644);
        const char line[] = "a helper outlived its candidate\n";
        if (fd >= 0) { (void)!write(fd, line, sizeof line - 1); close(fd); }
        _exit(0);
    }
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
relu_ext = load_inline(name="sandbox_start_process", cpp_sources=source, functions=["relu"],
                       extra_cflags=["-O3"])


class ModelNew(torch.nn.Module):
    def forward(self, x):
        return relu_ext.relu(x.contiguous())
