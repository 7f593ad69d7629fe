"""Returns a tensor subclass, which could defer or fake its work: only plain tensors count."""
import torch
from torch.utils.cpp_extension import load_inline

source = """
torch::Tensor relu(torch::Tensor x) {
    auto out = torch::empty_like(x);
    const float* in = x.data_ptr<float>();
    float* o = out.data_ptr<float>();
    for (int64_t i = 0; i < x.numel(); ++i) o[i] = in[i] > 0.f ? in[i] : 0.f;
    return out;
}
"""
ext = load_inline(name="adv_honest_relu", cpp_sources=source, functions=["relu"])


class Deferred(torch.Tensor):
    lazy = True


class ModelNew(torch.nn.Module):
    def forward(self, x):
        return ext.relu(x.contiguous()).as_subclass(Deferred)
