"""Multi-turn rollouts: a model writes a kernel for each task, reads the evaluator's feedback, tries again.

For every task, n parallel trajectories each take T turns. At every turn all live trajectories of a
group of tasks are generated in one batch and evaluated in one batch (evaluate.py), and each reply's
code, its closing summary and the evaluator's feedback become a "previous attempt" in the next turn's
prompt. The prompt of every turn holds the task's PyTorch `Model`, the rules, a one-shot example
(turn 1 only), the previous attempts, and a request to restart the reasoning and write new complete
code. Earlier reasoning is dropped; only the summaries stay. With --overlap there is no barrier between
turns: a trajectory's next turn is generated as soon as its own kernel is judged, batched with the others
ready by then, while the rest still build and run; each reply has its own seed, so the records are the same.

Paper defaults (Kevin, arXiv 2507.11948): 16 trajectories, 4 turns (8 at evaluation), temperature
0.9, 16,384 reply tokens. The paper is silent on the prompt budget: 16,384 prompt tokens is the
default here; attempts that no longer fit are dropped earliest first.

Run:
  python generate.py --tasks tasks/level1 --out runs/rollouts.jsonl                 # tiny model, hf
  python generate.py --backend vllm --model Qwen/QwQ-32B --turns 8 --out runs/eval.jsonl
  python generate.py --backend openai --base-url http://localhost:8000/v1 --model my-model ...
  python generate.py --device cpu --max-tokens 64 ...   # C++ instead of CUDA, evaluated on a CPU
  python generate.py --out - ... | python reward.py - > runs/rewarded.jsonl   # JSONL on stdout
  VLLM_ENABLE_V1_MULTIPROCESSING=0 .venv-vllm/bin/python generate.py --backend vllm \
      --gpu-memory-utilization 0.3 --device cpu --max-tokens 64 ...   # vLLM's CPU build (README)

Output: one JSON line per trajectory (see README, "Data formats"; turns numbered from 1), appended when
its group of tasks finishes; a re-run with the same --out skips the (task, trajectory) pairs already
written. --out's folder must exist, and a second run on an --out being written stops at once, as evaluate.py
-o does. A Ctrl-C drops the group under way and says in one line how many are written (exit status 130).
`--out -` (or a pipe) streams the lines to stdout instead, with nothing to resume; progress
and the summary table always go to stderr. The evaluation device is checked before anything is
generated, and a --model that is neither a local folder nor a cached or reachable hub id stops the run
before loading.

Simplifications: every trajectory runs all T turns (a correct kernel is told it can be made faster,
as in the paper). With --device cpu the rules ask for C++ (`load_inline` with `cpp_sources` only),
so the whole loop is meaningful without a GPU. The openai backend cannot see token ids: it records
none and estimates a prompt's length as characters / 4. The hf backend draws every reply's tokens on
the host, one random generator a reply, which suits small models and tests; use vllm for real runs.
"""

from __future__ import annotations

from kevin.startup import freeze_at_exit, quiet_ctrl_c_while_starting, started

if __name__ == "__main__":
    quiet_ctrl_c_while_starting("before writing anything")
    freeze_at_exit()

import argparse
import json
import os
import sys
import time
import zlib
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from kevin.dependencies import require

require("tqdm", "torch")

from tqdm import tqdm

from evaluate import EvalConfig, Evaluator, index_tasks, resolve_device
from kevin.backends import HFBackend, OpenAIBackend, VLLMBackend, check_model, check_vllm
from kevin.config_flags import add_config_flags, check, parse_config
from kevin.eval_records import open_output
from kevin.rollout_config import AT_LEAST_1, NOT_NEGATIVE, RolloutConfig
from kevin.static_rules import FENCE, RULE_PROFILES, extract_code
from kevin.tiny_model import build_tiny_model

REPO = Path(__file__).resolve().parent
SPLITS = REPO / "tasks" / "split.json"

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


# ---------------------------------------------------------------- tasks and output
@dataclass
class Task:
    id: str  # "<parent folder>/<file stem>"
    path: Path
    source: str


def load_tasks(tasks: str, split: str | None) -> list[Task]:
    """Tasks from a file or folder, or a split name of tasks/split.json; --split keeps only that split."""
    splits = json.loads(SPLITS.read_text()) if SPLITS.exists() else {}
    if not Path(tasks).exists():
        if tasks not in splits:
            raise SystemExit(f"error: --tasks {tasks}: not a task file, a folder or a split "
                             f"({', '.join(splits) or 'none'})")
        tasks, split = str(REPO / "tasks"), split or tasks
    index = index_tasks(tasks)
    if split:
        if split not in splits:
            raise SystemExit(f"error: --split {split}: {SPLITS} has only {', '.join(splits) or 'no splits'}")
        missing = [task_id for task_id in splits[split] if task_id not in index]
        if missing:
            raise SystemExit(f"error: --split {split}: {len(missing)} tasks not found in {tasks}, e.g. {missing[0]}")
        index = {task_id: index[task_id] for task_id in splits[split]}
    if not index:
        raise SystemExit(f"error: --tasks {tasks}: no task files (a Model class and get_inputs) found")
    return [Task(task_id, path, path.read_text()) for task_id, path in index.items()]


def is_stream(out: str) -> bool:
    """'-', or something like /dev/stdout or a named pipe: written as it goes, never read back."""
    path = Path(out)
    return out == "-" or path.exists() and not path.is_file() and not path.is_dir()


def read_done(out: Path) -> list[dict]:
    """The trajectories already in `out`, blank lines skipped; a last line cut off by an interrupted write is
    removed. A line that is not a trajectory stops the run before anything is generated."""
    text = out.read_text()
    if text and not text.endswith("\n"):
        text = text[: text.rfind("\n") + 1]
        out.write_text(text)
    return [parse_record(line, f"{out}:{number}") for number, line in enumerate(text.splitlines(), 1)
            if line.strip()]


def parse_record(line: str, where: str) -> dict:
    """One trajectory line of an earlier run, or a one-line error naming the line."""
    try:
        record = json.loads(line)
    except json.JSONDecodeError as error:
        raise SystemExit(f"error: --out {where}: not JSON ({error.msg}); fix the line or pick another --out") from None
    if not isinstance(record, dict) or not {"task", "trajectory", "turns"} <= record.keys():
        raise SystemExit(f"error: --out {where}: not a generate.py trajectory (task, trajectory, turns); "
                         "an existing --out is resumed, so pick another file")
    return record


# ---------------------------------------------------------------- the loop
def reply_seed(seed: int | str, record: dict) -> int:
    """The sampling seed of a record's next reply: from `seed`, its task, trajectory and turn, whatever batch it
    is generated in."""
    return zlib.crc32(f"{seed}/{record['task']}/{record['trajectory']}/{len(record['turns'])}".encode())


def next_turns(indices: list[int], records: list[dict], tasks: list[Task], backend, *, seed: int | str, device: str,
               context_budget: int, rules: str) -> dict[int, dict]:
    """One generation batch: for each i in `indices`, the next turn of records[i] (which solves tasks[i]), all but
    its eval."""
    prompts = [fit_prompt(tasks[i].source, records[i]["turns"], device, context_budget, backend.count_tokens, rules)
               for i in indices]
    replies = backend.generate(prompts, [reply_seed(seed, records[i]) for i in indices])
    turns = {}
    for i, messages, reply in zip(indices, prompts, replies):
        code, summary = parse_reply(reply.text)
        turns[i] = {"turn": len(records[i]["turns"]) + 1,  # turns are numbered from 1
                    "prompt": {"messages": messages, "token_ids": backend.prompt_token_ids(messages)},
                    "reply": {"text": reply.text, "token_ids": reply.token_ids, "logprobs": reply.logprobs},
                    "code": code, "summary": summary}
    return turns


def candidate(task: Task, turn: dict) -> dict:
    """What the evaluator gets: the answer without its reasoning; a reply without code goes in as empty code,
    which evaluate marks format_error without running anything."""
    answer = split_reasoning(turn["reply"]["text"])[1] if turn["code"] is not None else ""
    return {"task": str(task.path), "code": answer}


def run_turns(records: list[dict], tasks: list[Task], backend, eval_config: EvalConfig, *, turns: int,
              seed: int | str, device: str, context_budget: int, overlap: bool = False,
              progress=None) -> dict[str, float]:
    """Add `turns` turns to every trajectory record (record i solves tasks[i]); returns the seconds spent
    generating, and building and checking kernels (while any was: Evaluator.seconds).

    Synchronous (the paper's loop): every record's turn is generated in one batch, and all are judged before any
    next turn. With `overlap`, a record's next turn is generated as soon as its own kernel is judged, in one batch
    with every record ready by then, while the other kernels still build and run. A reply depends on its record
    and its seed only (`seed`, its task, trajectory and turn), not on its batch, so both orders give the same
    records for the same verdicts (a timed kernel's feedback quotes its times, which no two runs share); the hf
    backend's log-probs to their last bits, which a batch's size and padding change. `device` picks the kernel
    language the prompts ask for (cpu: C++); `progress` is advanced once a judged turn."""
    goal = [len(record["turns"]) + turns for record in records]
    ready, judging, pending = list(range(len(records))), 0, {}
    seconds = {"generate": 0.0}
    with Evaluator(eval_config, [str(task.path) for task in tasks], expected=len(records) * turns) as evaluator:
        while ready or judging:
            if ready and (overlap or not judging):
                generating = time.perf_counter()
                made = next_turns(sorted(ready), records, tasks, backend, seed=seed, device=device,
                                  context_budget=context_budget, rules=eval_config.rules)
                seconds["generate"] += time.perf_counter() - generating
                evaluator.submit([candidate(tasks[i], turn) for i, turn in made.items()], made)
                pending |= made
                judging, ready = judging + len(made), []
            for i, result in evaluator.wait():
                records[i]["turns"].append({**pending.pop(i), "eval": result})
                judging -= 1
                if len(records[i]["turns"]) < goal[i]:
                    ready.append(i)
                if progress is not None:
                    progress.update(1)
    return {**seconds, **evaluator.seconds()}


def summary_table(records: list[dict]) -> str:
    """Per turn (numbered from 1, by position, so files of any age read alike): kernels, share that compiled,
    share correct, mean speedup of the correct ones."""
    if not records:
        return "no rows: no trajectories to summarise"
    by_turn: dict[int, list[dict]] = {}
    for record in records:
        for number, turn in enumerate(record["turns"], 1):
            by_turn.setdefault(number, []).append(turn["eval"])
    lines = [f"{len(records)} trajectories of {len({r['task'] for r in records})} tasks, by turn:",
             f"{'turn':>4} {'kernels':>8} {'compiled':>9} {'correct':>8} {'mean speedup of correct':>24}"]
    for turn, evals in sorted(by_turn.items()):
        speedups = [e["speedup"] for e in evals if e["correct"]]
        mean = f"{sum(speedups) / len(speedups):.2f}x" if speedups else "-"
        lines.append(f"{turn:>4} {len(evals):>8} {sum(e['compiled'] for e in evals) / len(evals):>9.0%} "
                     f"{sum(e['correct'] for e in evals) / len(evals):>8.0%} {mean:>24}")
    return "\n".join(lines)


def make_backend(args: GenerateConfig):
    """The backend --backend names, its model checked first; progress bars on stderr."""
    model = args.model
    if args.backend == "openai":
        return OpenAIBackend(model, args.temperature, args.max_tokens, args.base_url,
                             os.environ.get(args.api_key_env), args.concurrency, args.retries, progress=True)
    if args.backend == "vllm":
        check_vllm()
    model = build_tiny_model() if model == "tiny" else model
    check_model(model)
    if args.backend == "hf":
        return HFBackend(model, args.temperature, args.max_tokens, progress=True)
    return VLLMBackend(model, args.temperature, args.max_tokens, args.tensor_parallel_size,
                       args.gpu_memory_utilization, args.seed, progress=True)


@dataclass
class GenerateConfig(RolloutConfig):
    """The rollout settings (kevin/rollout_config.py) and generate.py's own: output, backends, evaluation."""
    out: str = field(kw_only=True)
    """output JSONL, one trajectory a line; an existing file is resumed; - for stdout"""
    tasks_per_batch: int = 8
    """tasks whose trajectories share the generation and evaluation batches and are written together when done
    (0: all tasks at once)"""
    backend: Literal["hf", "vllm", "openai"] = "hf"
    """how replies are generated"""
    tensor_parallel_size: int = 1
    """vllm: GPUs one model is split over"""
    base_url: str = "http://localhost:8000/v1"
    """openai: endpoint base URL"""
    api_key_env: str = "OPENAI_API_KEY"
    """openai: environment variable holding the key"""
    concurrency: int = 32
    """openai: requests in flight at once"""
    retries: int = 5
    """openai: retries of a request that timed out, lost its connection or got a 429 or 5xx (waiting 1, 2, 4, 8,
    8... s); a refused connection or another 4xx stops the run at once"""
    device: Literal["auto", "cuda", "cpu"] = EvalConfig.device
    """where candidates are evaluated; cpu asks for C++ kernels instead of CUDA; auto: cuda when a GPU is visible"""
    gpus: list[int] | None = None
    """comma-separated GPU ids for evaluation (default: all visible)"""

    def __post_init__(self):
        super().__post_init__()
        check(self, {"tensor_parallel_size": AT_LEAST_1, "concurrency": AT_LEAST_1, "tasks_per_batch": NOT_NEGATIVE,
                     "retries": NOT_NEGATIVE,
                     "gpus": ("be GPU ids like 0,1", lambda gpus: bool(gpus) and min(gpus) >= 0)})


def _parser() -> argparse.ArgumentParser:
    """One flag per GenerateConfig field (kevin/config_flags.py); the splits on offer in the last line."""
    splits = ", ".join(json.loads(SPLITS.read_text())) if SPLITS.exists() else "none"
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                epilog=f"--split and --tasks take a split name of tasks/split.json ({splits})")
    add_config_flags(p, GenerateConfig)
    return p


def parse_args(argv=None) -> GenerateConfig:
    """The flags given, over GenerateConfig's defaults; a bad value is a one-line error."""
    return parse_config(_parser(), GenerateConfig, argv)


def kernel_device(args: GenerateConfig) -> str:
    """'cuda' or 'cpu' (--device auto resolved): where candidates run, so which kernels the prompts ask for.
    An impossible choice (cuda without a GPU, --gpus not visible) stops the run here, before any generation."""
    return resolve_device(EvalConfig(device=args.device, gpus=args.gpus))[0]


def roll_out(todo: list[tuple[Task, int]], backend, args: GenerateConfig, device: str):
    """Yield the finished trajectory records of each group of --tasks-per-batch tasks, all turns done."""
    eval_config = EvalConfig(device=device, gpus=args.gpus, rules=args.rules)
    size = (args.tasks_per_batch or len(todo)) * args.n_trajectories
    groups = [todo[i:i + size] for i in range(0, len(todo), size)]
    with tqdm(total=len(todo) * args.turns, desc="rollouts", unit="turn", file=sys.stderr) as progress:
        for group in groups:
            records = [{"task": task.id, "trajectory": k, "turns": []} for task, k in group]
            run_turns(records, [task for task, _ in group], backend, eval_config, turns=args.turns, seed=args.seed,
                      device=device, context_budget=args.context_budget, overlap=args.overlap, progress=progress)
            yield records


@contextmanager
def open_out(out: str, stream: bool):
    """stdout for '-', a stream as it is; else the file opened to append and locked, as evaluate.py's -o is (a second
    run on it stops at once instead of writing every trajectory again), and removed again if this run made it and
    wrote nothing (a run that fails before its first group leaves no empty file). A missing folder is an error."""
    if out == "-":
        yield sys.stdout
        return
    if stream:
        with open(out, "a") as f:
            yield f
        return
    if Path(out).is_dir():
        raise SystemExit(f"error: --out {out} is a folder; give a file, e.g. {Path(out) / 'rollouts.jsonl'}")
    made = not Path(out).exists()
    f = open_output(out)
    try:
        yield f
    finally:
        if made and f.tell() == 0:
            os.remove(out)  # while still locked: no other run can have opened it to write
        f.close()


def main(argv=None, backend=None) -> None:
    """Run from the command line; `backend` replaces the one --backend names (it must have the same methods). A
    Ctrl-C says in one line how many trajectories are written (a re-run goes on from there) and exits with 130."""
    args = parse_args(argv)
    tasks = load_tasks(args.tasks, args.split)
    device = kernel_device(args)
    stream = is_stream(args.out)
    with open_out(args.out, stream) as f:  # locked before it is read: what it holds is this run's to go on from
        earlier = [] if stream else read_done(Path(args.out))
        done = {(r["task"], r["trajectory"]) for r in earlier}
        todo = [(task, k) for task in tasks for k in range(args.n_trajectories) if (task.id, k) not in done]
        print(f"{len(tasks)} tasks x {args.n_trajectories} trajectories: {len(done)} already in {args.out}, "
              f"{len(todo)} to run (kernels for {device})", file=sys.stderr)
        started()  # from here on, a Ctrl-C is main's to report
        written = []
        try:
            if todo:
                backend = backend or make_backend(args)
                for records in roll_out(todo, backend, args, device):
                    f.write("".join(json.dumps(record) + "\n" for record in records))
                    f.flush()
                    written += records
            ids = {task.id for task in tasks}
            print(summary_table([r for r in earlier + written if r["task"] in ids]), file=sys.stderr)
        except KeyboardInterrupt:  # evaluate has stopped its children; a group cut short is not written
            total, resume = len(tasks) * args.n_trajectories, "" if stream else "; re-run to resume"
            print(f"interrupted: {total - len(todo) + len(written)} of {total} trajectories written{resume}",
                  file=sys.stderr)
            raise SystemExit(130) from None


if __name__ == "__main__":
    main()
