"""Gives a different answer every other call, as a race or an uninitialised read would."""
import torch
from torch.utils.cpp_extension import load_inline

source = """
torch::Tensor relu(torch::Tensor x) {
    static int64_t calls = 0;
    const float shift = (calls++ % 2) ? 1.f : 0.f;
    auto out = torch::empty_like(x);
    const float* in = x.data_ptr<float>();
    float* o = out.data_ptr<float>();
    for (int64_t i = 0; i < x.numel(); ++i) o[i] = (in[i] > 0.f ? in[i] : 0.f) + shift;
    return out;
}
"""
ext = load_inline(name="adv_flaky", cpp_sources=source, functions=["relu"])


class ModelNew(torch.nn.Module):
    def forward(self, x):
        return ext.relu(x.contiguous())
