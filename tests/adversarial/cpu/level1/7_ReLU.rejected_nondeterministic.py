"""Gives a slightly different answer every other call, as a race that lands inside the tolerance would: 0.1% off,
well within atol = rtol = 1e-2 of the reference, but far from its own first run on the same inputs."""
import torch
from torch.utils.cpp_extension import load_inline

source = """
torch::Tensor relu(torch::Tensor x) {
    static int64_t calls = 0;
    const float drift = (calls++ % 2) ? 1.001f : 1.f;
    auto out = torch::empty_like(x);
    const float* in = x.data_ptr<float>();
    float* o = out.data_ptr<float>();
    for (int64_t i = 0; i < x.numel(); ++i) o[i] = (in[i] > 0.f ? in[i] : 0.f) * drift;
    return out;
}
"""
ext = load_inline(name="adv_flaky", cpp_sources=source, functions=["relu"])


class ModelNew(torch.nn.Module):
    def forward(self, x):
        return ext.relu(x.contiguous())
