"""The multi-turn loop that generate.py, train.py and scale_test.py run: each trajectory's next turn generated,
its kernel evaluated, and the attempt added to the next prompt (`run_turns`); the backends made from a config."""
from __future__ import annotations

import os
import time
import zlib

from kevin.backends import HFBackend, OpenAIBackend, VLLMBackend, check_model, check_vllm
from kevin.evaluator import EvalConfig, open_evaluator, resolve_device
from kevin.prompts import fit_prompt, parse_reply, split_reasoning
from kevin.rollout_config import GenerateConfig
from kevin.tasks import Task
from kevin.tiny_model import build_tiny_model


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
    with open_evaluator(eval_config, [str(task.path) for task in tasks], expected=len(records) * turns) as evaluator:
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


def kernel_device(args: GenerateConfig) -> str:
    """'cuda' or 'cpu' (--device auto resolved): where candidates run, so which kernels the prompts ask for.
    An impossible choice (cuda without a GPU, --gpus not visible) stops the run here, before any generation."""
    return resolve_device(EvalConfig(device=args.device, gpus=args.gpus, ray=args.ray))[0]
