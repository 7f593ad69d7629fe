"""Starts a thread through the threading module that torch.cuda happens to import: no import statement."""
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


class ModelNew(torch.nn.Module):
    def forward(self, x):
        torch.cuda.threading.Thread(target=torch.cuda.threading.Event().wait, args=(600,), daemon=True).start()
        return ext.relu(x.contiguous())
