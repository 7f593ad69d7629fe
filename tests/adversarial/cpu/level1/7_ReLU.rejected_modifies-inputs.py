"""Uses its input as scratch: ReLU computed in place there, then copied into a new output. Right values, a fresh
output, but the caller's tensor is changed."""
import torch
from torch.utils.cpp_extension import load_inline

source = """
torch::Tensor relu(torch::Tensor x) {
    float* p = x.data_ptr<float>();
    auto out = torch::empty_like(x);
    float* o = out.data_ptr<float>();
    for (int64_t i = 0; i < x.numel(); ++i) {
        p[i] = p[i] > 0.f ? p[i] : 0.f;
        o[i] = p[i];
    }
    return out;
}
"""
ext = load_inline(name="adv_in_place", cpp_sources=source, functions=["relu"])


class ModelNew(torch.nn.Module):
    def forward(self, x):
        return ext.relu(x)
