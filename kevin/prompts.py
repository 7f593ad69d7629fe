"""What the policy reads and writes: the prompt of each turn (the task, the rules, a one-shot example on the
first turn, the earlier attempts with their summaries and feedback) and the parsing of a reply into its code and
summary. generate.py, train.py and warm_start.py all go through these, so that a model learns the format it is
later asked in."""
from __future__ import annotations

from kevin.static_rules import FENCE, RULE_PROFILES, extract_code


# ---------------------------------------------------------------- prompt templates
INSTRUCTIONS = {  # the prompt's opening, by the kind of kernel asked for
    "cuda": """\
You write custom CUDA kernels that replace the PyTorch operators of a given architecture to make it faster.

Rules:
- Define `class ModelNew(torch.nn.Module)` with the same constructor and `forward` signature as `Model`.
- Do the computation in raw CUDA kernels that you write yourself and build with \
`torch.utils.cpp_extension.load_inline` (kernels and their launchers in `cuda_sources`, declarations in \
`cpp_sources`, exported names in `functions`).
{torch_rule}
{parameters_rule}
- Do not write try/except or `pass`.
- Reply with the complete code in one fenced ```python block, and end your reply with a few sentences \
summarising the changes you made.""",
    "cpu": """\
You write custom C++ kernels that replace the PyTorch operators of a given architecture to make it faster.

Rules:
- Define `class ModelNew(torch.nn.Module)` with the same constructor and `forward` signature as `Model`.
- Do the computation in C++ loops that you write yourself and build with \
`torch.utils.cpp_extension.load_inline`, passing `cpp_sources` only (no `cuda_sources`) and the exported \
names in `functions`. Inside C++, only allocate outputs (e.g. `torch::empty_like`) and read raw pointers.
{torch_rule}
{parameters_rule}
- Do not write try/except or `pass`.
- Reply with the complete code in one fenced ```python block, and end your reply with a few sentences \
summarising the changes you made.""",
}

PARAMETERS_RULE = (
    "- The same seed is set before building `Model` and before building `ModelNew`. Where you replace a torch.nn "
    "layer, create its parameters with the same shapes and the same init calls, in the same order, as the layer "
    "does (nn.Linear: weight (out, in) with init.kaiming_uniform_(a=math.sqrt(5)), then bias with "
    "init.uniform_(-1/math.sqrt(in), 1/math.sqrt(in))), so that they match.")

EXAMPLE_MODEL = '''\
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, a, b):
        return a + b


def get_inputs():
    return [torch.rand(4096), torch.rand(4096)]


def get_init_inputs():
    return []
'''

EXAMPLE_SOLUTION = {
    "cuda": '''\
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
#include <torch/extension.h>

__global__ void add_kernel(const float* a, const float* b, float* out, int64_t n) {
    int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (i < n) out[i] = a[i] + b[i];
}

torch::Tensor add(torch::Tensor a, torch::Tensor b) {
    auto out = torch::empty_like(a);
    int64_t n = a.numel();
    int threads = 256;
    int blocks = (int)((n + threads - 1) / threads);
    add_kernel<<<blocks, threads>>>(a.data_ptr<float>(), b.data_ptr<float>(), out.data_ptr<float>(), n);
    return out;
}
"""

cpp_source = "torch::Tensor add(torch::Tensor a, torch::Tensor b);"

add_ext = load_inline(name="add_ext", cpp_sources=cpp_source, cuda_sources=cuda_source, functions=["add"])


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, a, b):
        return add_ext.add(a.contiguous(), b.contiguous())
''',
    "cpu": '''\
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cpp_source = r"""
#include <torch/extension.h>

torch::Tensor add(torch::Tensor a, torch::Tensor b) {
    auto out = torch::empty_like(a);
    const float* pa = a.data_ptr<float>();
    const float* pb = b.data_ptr<float>();
    float* po = out.data_ptr<float>();
    int64_t n = a.numel();
    for (int64_t i = 0; i < n; ++i) po[i] = pa[i] + pb[i];
    return out;
}
"""

add_ext = load_inline(name="add_ext", cpp_sources=cpp_source, functions=["add"])


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, a, b):
        return add_ext.add(a.contiguous(), b.contiguous())
''',
}

EXAMPLE_SUMMARY = (
    "I replaced the addition with one kernel that adds the two inputs element by element into a new "
    "output tensor; the inputs are made contiguous first so that flat indexing is valid."
)

EXAMPLE = """\
Here is an example. For this architecture:
```python
{model}```
a valid answer is:
```python
{solution}```
{summary}"""

TASK = """\
Here is the architecture to optimise:
```python
{source}```"""

ATTEMPTS_HEADER = "Your previous attempts, oldest first, with the feedback each one received:"

ATTEMPT = """\
### Attempt {number}
{code}
Your summary: {summary}
Feedback: {feedback}"""

CODE = """\
```python
{code}
```"""

NO_CODE = "(no code block found)"
NO_SUMMARY = "(none)"

FIRST_REQUEST = "Now write `ModelNew` for the architecture above."
NEXT_REQUEST = (
    "Restart your reasoning from scratch: think again about the architecture and the feedback above, "
    "then write new, complete code for `ModelNew` that fixes the errors or is faster than the best "
    "correct attempt."
)


# ---------------------------------------------------------------- prompts
def render_prompt(source: str, attempts: list[dict], first_turn: bool, device: str,
                  rules: str = "kevin") -> list[dict]:
    """The user message of one turn; `attempts` are earlier turn records (code, summary, eval); `rules`, the rule
    profile that judges (evaluate.py's --rules)."""
    kind = "cpu" if device == "cpu" else "cuda"
    parts = [INSTRUCTIONS[kind].format(torch_rule=RULE_PROFILES[rules].prompt_line, parameters_rule=PARAMETERS_RULE)]
    if first_turn:
        parts.append(EXAMPLE.format(model=EXAMPLE_MODEL, solution=EXAMPLE_SOLUTION[kind], summary=EXAMPLE_SUMMARY))
    parts.append(TASK.format(source=source if source.endswith("\n") else source + "\n"))
    if attempts:
        parts.append(ATTEMPTS_HEADER)
        for attempt in attempts:
            parts.append(ATTEMPT.format(
                number=attempt["turn"],
                code=CODE.format(code=attempt["code"].rstrip("\n")) if attempt["code"] is not None else NO_CODE,
                summary=attempt["summary"] or NO_SUMMARY,
                feedback=attempt["eval"]["feedback"],
            ))
    parts.append(FIRST_REQUEST if first_turn else NEXT_REQUEST)
    return [{"role": "user", "content": "\n\n".join(parts)}]


def fit_prompt(source: str, history: list[dict], device: str, budget: int, count_tokens,
               rules: str = "kevin") -> list[dict]:
    """The prompt with as many of the latest attempts as fit in `budget` tokens (earliest dropped first)."""
    first_turn = not history
    for start in range(len(history) + 1):
        messages = render_prompt(source, history[start:], first_turn, device, rules)
        if count_tokens(messages) <= budget:
            return messages
    return messages  # even without attempts it is too long: send it anyway, the task must be shown


# ---------------------------------------------------------------- reply parsing
def split_reasoning(text: str) -> tuple[str | None, str]:
    """(reasoning, answer). An unclosed <think> means the reply ended while still reasoning."""
    if "</think>" in text:
        reasoning, answer = text.split("</think>", 1)
        return reasoning.split("<think>", 1)[-1], answer
    if "<think>" in text:
        return text.split("<think>", 1)[1], ""
    return None, text


def parse_reply(text: str) -> tuple[str | None, str | None]:
    """(code, summary): the block evaluate.py takes as the candidate, and the answer's text after it."""
    _, answer = split_reasoning(text)
    if "```" not in answer:  # evaluate would read fence-less text as source; a reply must fence its code
        return None, None
    code = extract_code(answer)
    if code is None:
        return None, None
    end = [m.end() for m in FENCE.finditer(answer) if m.group(2) == code][-1]
    return code, answer[end:].strip()
