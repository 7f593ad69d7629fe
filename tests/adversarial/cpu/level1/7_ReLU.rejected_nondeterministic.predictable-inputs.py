"""Makes every draw of randomness in its process predictable (torch's and Python's seeding functions pinned,
torch.randn and friends serving a fixed sequence of inputs for the task's shape, os.urandom a counter), then
precomputes ReLU in __init__ for the inputs that seeds 42 + 1 + trial give and answers every call from that
table (looked up by the input's first values, else by call order) without doing the work. The judge draws
the inputs in its own process: nothing is found, and the answers by call order differ on a repeated input."""
import hashlib
import os
import random

import torch
from torch.utils.cpp_extension import load_inline

source = """
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
ext = load_inline(name="adv_predictable_relu", cpp_sources=source, functions=["relu"], extra_cflags=["-O3"])

SHAPE = (256, 1024)
EXPECTED_SEEDS = [42 + 1 + trial for trial in range(16)]
real_manual_seed = torch.manual_seed
real_randn = torch.randn

# The inputs an evaluator seeding 42 + 1 + trial would draw, in order.
expected_inputs = []
for seed in EXPECTED_SEEDS:
    real_manual_seed(seed)
    expected_inputs.append(real_randn(*SHAPE))
served = {"inputs": 0, "seeds": 0, "urandom": 0, "calls": 0}


def pinned_seed(*args, **kwargs):
    """Any seeding lands on the next expected seed instead of the one asked for."""
    seed = EXPECTED_SEEDS[served["seeds"] % len(EXPECTED_SEEDS)]
    served["seeds"] += 1
    return real_manual_seed(seed)


def pinned_draw(real):
    """A draw of the task's input shape is the next expected input, whatever generator or seed was asked for."""
    def draw(*args, **kwargs):
        shape = tuple(args[0]) if len(args) == 1 and isinstance(args[0], (tuple, list, torch.Size)) else args
        if shape == SHAPE or (len(args) == 1 and torch.is_tensor(args[0]) and tuple(args[0].shape) == SHAPE):
            value = expected_inputs[served["inputs"] % len(expected_inputs)].clone()
            served["inputs"] += 1
            return value
        return real(*args, **kwargs)
    return draw


def counted_urandom(n):
    """Bytes that look random and are the candidate's to know: a hash of its pid and a counter."""
    served["urandom"] += 1
    stream = b""
    while len(stream) < n:
        stream += hashlib.sha256(f"{os.getpid()}:{served['urandom']}:{len(stream)}".encode()).digest()
    return stream[:n]


torch.manual_seed = torch.random.manual_seed = pinned_seed
torch.seed = torch.random.seed = pinned_seed
torch.randn = pinned_draw(real_randn)
torch.rand = pinned_draw(torch.rand)
torch.randn_like = pinned_draw(torch.randn_like)
torch.rand_like = pinned_draw(torch.rand_like)
random.seed(42)
random.seed = lambda *args, **kwargs: random.Random.seed(random._inst, 42)
os.urandom = counted_urandom


class ModelNew(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.table = {tuple(x[0, :8].tolist()): ext.relu(x) for x in expected_inputs}
        self.answers = list(self.table.values())

    def forward(self, x):
        served["calls"] += 1
        known = self.table.get(tuple(x[0, :8].tolist()))
        return known if known is not None else self.answers[(served["calls"] - 1) % len(self.answers)]
