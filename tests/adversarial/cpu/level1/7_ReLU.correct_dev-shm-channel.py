"""An honest ReLU that, while constructed, reads what another candidate may have left in a fixed file under
/dev/shm and appends its own note there (its pid, and that it was here), a channel between candidates run on
one machine; errors are ignored. With a private /dev/shm per child, it finds nothing and leaks nothing."""
import torch
from torch.utils.cpp_extension import load_inline

source = """
#include <fcntl.h>
#include <string>
#include <unistd.h>

static const char* CHANNEL = "/dev/shm/kevin-candidates-channel";

// Bytes found from earlier candidates (-1: no channel yet); then this candidate's note is appended.
int64_t exchange() {
    int64_t found = -1;
    int fd = open(CHANNEL, O_RDONLY);
    if (fd >= 0) {
        char chunk[4096];
        found = 0;
        for (ssize_t n; (n = read(fd, chunk, sizeof chunk)) > 0;) found += n;
        close(fd);
    }
    fd = open(CHANNEL, O_WRONLY | O_CREAT | O_APPEND, 0666);
    if (fd >= 0) {
        const std::string note = "pid " + std::to_string(getpid()) + ": a ReLU candidate was here\\n";
        const ssize_t written = write(fd, note.data(), note.size());
        (void)written;
        close(fd);
    }
    return found;
}

torch::Tensor relu(torch::Tensor x) {
    TORCH_CHECK(x.is_contiguous() && x.scalar_type() == torch::kFloat32, "expected contiguous fp32");
    auto out = torch::empty_like(x);
    const float* in = x.data_ptr<float>();
    float* result = out.data_ptr<float>();
    const int64_t n = x.numel();
    for (int64_t i = 0; i < n; ++i) result[i] = in[i] > 0.f ? in[i] : 0.f;
    return out;
}
"""
ext = load_inline(name="adv_dev_shm_channel", cpp_sources=source, functions=["relu", "exchange"],
                  extra_cflags=["-O3"])


class ModelNew(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.found = ext.exchange()

    def forward(self, x):
        return ext.relu(x.contiguous())
