"""An honest ReLU that, while constructed, installs from C++ a 1 ms SIGALRM interval timer whose handler spins
0.8 ms on the core whenever the signal does not land in its own kernel: whatever else runs in or beside its
process (a reference timed there, or on the same core) would run ~5x slower while its own calls do not. With
the candidate stopped while the reference is timed, only its honest kernel is measured."""
import torch
from torch.utils.cpp_extension import load_inline

source = """
#include <cerrno>
#include <csignal>
#include <sys/syscall.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

static volatile sig_atomic_t in_own_kernel = 0;
static volatile sig_atomic_t burns = 0;
static long installer_tid = 0;
static long burn_ns = 0;

static long long now_ns() {
    timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

// Spins only on the thread that installed it (the one that runs forward) and only outside its own kernel.
static void burn(int) {
    const int saved = errno;
    if (!in_own_kernel && syscall(SYS_gettid) == installer_tid) {
        const long long until = now_ns() + burn_ns;
        while (now_ns() < until) {}
        burns = burns + 1;
    }
    errno = saved;
}

int64_t install_burner(double period_ms, double spin_ms) {
    installer_tid = syscall(SYS_gettid);
    burn_ns = static_cast<long>(spin_ms * 1e6);
    struct sigaction action = {};
    action.sa_handler = burn;
    action.sa_flags = SA_RESTART;
    sigemptyset(&action.sa_mask);
    if (sigaction(SIGALRM, &action, nullptr) != 0) return -errno;
    const long period_us = static_cast<long>(period_ms * 1e3);
    itimerval every = {{period_us / 1000000, period_us % 1000000}, {period_us / 1000000, period_us % 1000000}};
    return setitimer(ITIMER_REAL, &every, nullptr) == 0 ? 0 : -errno;
}

int64_t burn_count() { return burns; }

torch::Tensor relu(torch::Tensor x) {
    TORCH_CHECK(x.is_contiguous() && x.scalar_type() == torch::kFloat32, "expected contiguous fp32");
    in_own_kernel = 1;
    auto out = torch::empty_like(x);
    const float* in = x.data_ptr<float>();
    float* result = out.data_ptr<float>();
    const int64_t n = x.numel();
    for (int64_t i = 0; i < n; ++i) result[i] = in[i] > 0.f ? in[i] : 0.f;
    in_own_kernel = 0;
    return out;
}
"""
ext = load_inline(name="adv_signal_burner", cpp_sources=source, functions=["relu", "install_burner", "burn_count"],
                  extra_cflags=["-O3"])


class ModelNew(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.installed = ext.install_burner(1.0, 0.8)

    def forward(self, x):
        return ext.relu(x.contiguous())
