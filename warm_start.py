"""Warm start: supervised fine-tuning on a library of kernel variants, so that a small policy writes
parseable candidates before RL.

A randomly initialised model writes junk: every reply is a format error, every GRPO group has zero
spread and RL has nothing to learn from. This stage teaches a model a small library of hand-written
variants per task, some that fail (compile error, wrong result), some correct but slow, some correct
and fast: files `<level>/<task stem>.<status>_<what>.py` (solutions/warm_start/), whose docstring is
the summary the policy writes after the code. The pairs go through generate.py's own prompts and reply
format, so that generate.py and train.py parse what the model learned:

  turn 1    prompt: the task, no attempts            replies: every variant of the task, once
  turn t>1  prompt: earlier attempts, each with the  replies: every variant a refiner may try next:
            evaluator's real feedback (evaluate.py    any variant that scores at least as well as
            runs the library once here)               the last attempt, a failing one never repeated

  fixes     with --near-misses N: N near misses of each correct variant (one line dropped), judged by the
            evaluator; each judged wrong is an attempt, with its real feedback, that the variant it came from
            follows (after it as the first attempt, and after a sampled history): so that turn t+1 has seen the
            feedback of turn t name what to change, and the fix that changes it

Attempt histories are paths sampled from that rule (--paths per task, up to --turns - 1 attempts
long), so later-turn prompts look like those of a multi-turn rollout; the decimal numbers in quoted
feedback (timings, speedups, differences) are jittered, since no two evaluations time a kernel alike.
The library is small on purpose and its variants of one task share all text but their first lines:
the policy should reproduce it verbatim, so that during RL almost every kernel it writes is one that
the evaluator's content-addressed build cache already holds (a new kernel costs a full build).

With --model tiny (the default) the model is a fresh Qwen2 of --layers x --hidden on the tiny model's
tokenizer (kevin/tiny_model.py), larger than the tiny model itself so that it memorises the library in a
short run; any other --model is a Hugging Face path fine-tuned as it is. The loss is the mean
log-likelihood of the reply tokens (the reply's end-of-turn token included), computed with the batching
train.py uses (kevin/batching.py), so positions and padding match what RL will see.

Run:
  python warm_start.py --out runs/warm_start                        # CUDA library on its demo-sized tasks
  python warm_start.py --device cpu --out runs/warm_start_cpu       # C++ library on tests/tasks
  python train.py --model runs/warm_start ...                       # RL from the warm-started policy

Output (--out): the model with its tokenizer and generation config (train.py --model and generate.py
--model load it), library_evals.jsonl (the evaluator's verdict on each variant), warm_start.json (the
library, the examples per turn, the loss, and a sampling check: of the replies sampled at the RL
temperature, how many parse, how many are a library variant word for word, how many distinct new
kernels appear), and a summary table.

Resuming: every --save-every steps, after the last step, and after the step under way when a Ctrl-C comes (the run
then stops with one line and exit status 130), --out/checkpoint.pt saves the model, the optimizer, the losses and
the library's evaluations. A re-run with the same --out and training flags goes on from there: the library is not
evaluated again (the prompts quote the same feedback) and training sees the batches an uninterrupted run would.
The checkpoint is removed once the outputs are written.
"""
from __future__ import annotations

from kevin.startup import freeze_at_exit, quiet_ctrl_c_while_starting, started

if __name__ == "__main__":
    quiet_ctrl_c_while_starting("before training")
    freeze_at_exit()

import argparse
import ast
import itertools
import json
import math
import random
import re
import signal
import sys
import time
from pathlib import Path

import torch
from accelerate import Accelerator
from accelerate.utils import broadcast_object_list, set_seed
from tqdm import tqdm
from transformers import AutoModelForCausalLM, AutoTokenizer

from kevin import rewards
from kevin.backends import ChatTokens, HFBackend, token_progress
from kevin.batching import Sample, collate, reply_logits, token_logprobs
from kevin.config_flags import add_config_flags, parse_config
from kevin.eval_records import library_records
from kevin.evaluator import STATUSES, EvalConfig, evaluate
from kevin.prompts import parse_reply, render_prompt
from kevin.tasks import load_tasks
from kevin.warm_policy import CHECKPOINT, WarmStartConfig, shown, training_flags
from kevin.tiny_model import build_tiny_model, random_qwen2

# ---------------------------------------------------------------- the library
def split_variant(source: str, name: str) -> tuple[str, str]:
    """(code, summary): a library file without its docstring, and the docstring as one line."""
    tree = ast.parse(source)
    summary = ast.get_docstring(tree)
    if not summary:
        raise SystemExit(f"error: {name}: a variant needs a docstring (the summary the policy writes after its code)")
    first = tree.body[0]
    code = "\n".join(source.splitlines()[first.end_lineno:]).lstrip("\n")
    return code if code.endswith("\n") else code + "\n", " ".join(summary.split())


def reply_text(code: str, summary: str) -> str:
    """What the policy should write: the code in one fenced block, then its summary (generate.parse_reply's format)."""
    return f"```python\n{code}```\n{summary}"


def load_library(folder: Path) -> list[dict]:
    """One dict per variant file: task, variant name, code, summary, the reply text."""
    variants = []
    for record in library_records(folder):
        code, summary = split_variant(record["code"], record["solution"])
        variants.append({"task": record["task"], "variant": record["solution"], "code": code, "summary": summary,
                         "reply": reply_text(code, summary)})
    if not variants:
        raise SystemExit(f"error: --library {folder}: no variant files (<level>/<task stem>.<status>_<what>.py)")
    return variants


def expected_status(variant: str) -> str:
    """The status a library file's name promises: `level1/7_ReLU.correct_vec4` -> `correct`."""
    what = variant.split(".", 1)[1]
    return next(s for s in sorted(STATUSES, key=len, reverse=True) if what.startswith(s))


def next_variants(variants: list[dict], last: dict) -> list[dict]:
    """What a refiner may try after `last`: any variant scoring at least as well, a failing one never twice."""
    return [v for v in variants if v["score"] >= last["score"] and not (v is last and v["score"] == 0)]


def histories(variants: list[dict], turns: int, paths: int, rng: random.Random) -> list[tuple[int, ...]]:
    """Distinct attempt histories (indices into `variants`) of 1 .. turns-1 attempts, as prefixes of
    `paths` paths that start anywhere and move by `next_variants`; in order of first appearance."""
    seen: dict[tuple[int, ...], None] = {}
    for _ in range(paths):
        path = [rng.randrange(len(variants))]
        while len(path) < turns - 1:
            path.append(variants.index(rng.choice(next_variants(variants, variants[path[-1]]))))
        for k in range(1, len(path) + 1):
            seen.setdefault(tuple(path[:k]), None)
    return list(seen)


def near_misses(code: str, count: int, rng: random.Random) -> list[str]:
    """Up to `count` near misses of a kernel, each its code with one non-blank line (Python or C++) dropped: the slips
    a policy that memorised its library makes, which the evaluator's feedback names (the line that no longer
    parses or compiles, the name it misses at run time, or that the output is wrong)."""
    lines = code.splitlines(keepends=True)
    kept = [i for i, line in enumerate(lines) if line.strip()]
    dropped = rng.sample(kept, min(count, len(kept)))
    return ["".join(lines[:i] + lines[i + 1:]) for i in sorted(dropped)]


def jitter_numbers(feedback: str, rng: random.Random) -> str:
    """The feedback with every decimal number scaled by a random factor in [0.5, 2], digits kept: a kernel's
    timings differ from one evaluation to the next, and the policy should not key on one run's numbers."""
    def scaled(match: re.Match) -> str:
        decimals = len(match.group(0).split(".")[1])
        return f"{float(match.group(0)) * 2 ** rng.uniform(-1, 1):.{decimals}f}"

    return re.sub(r"\d+\.\d+", scaled, feedback)


def sft_examples(task_source: str, variants: list[dict], turns: int, paths: int, device: str,
                 rng: random.Random, misses: list[dict] = ()) -> list[dict]:
    """(messages, reply, turn) pairs for one task: turn 1 with every variant, later turns after sampled histories
    (turns numbered from 1, as generate.py numbers them), and for each of `misses` (near misses judged wrong, each
    with its "code", "summary", "eval" and "fix", the variant it came from) the fix after it, once as the first
    attempt and once after a sampled history: feedback-conditioned fixes.

    Later-turn variants need "eval" (an evaluate.py result, whose feedback the prompt quotes, its numbers
    jittered) and "score"."""
    def quoted(history: list[dict]) -> list[dict]:
        return [{"turn": t, "code": a["code"], "summary": a["summary"],
                 "eval": {"feedback": jitter_numbers(a["eval"]["feedback"], rng)}} for t, a in enumerate(history, 1)]

    examples = [{"messages": render_prompt(task_source, [], True, device), "reply": v["reply"], "turn": 1,
                 "variant": v["variant"]} for v in variants]
    sampled = histories(variants, turns, paths, rng) if turns > 1 else []
    for history in sampled:
        messages = render_prompt(task_source, quoted([variants[i] for i in history]), False, device)
        examples += [{"messages": messages, "reply": v["reply"], "turn": len(history) + 1, "variant": v["variant"]}
                     for v in next_variants(variants, variants[history[-1]])]
    shorter = [h for h in sampled if len(h) < turns - 1]
    for miss in misses if turns > 1 else []:
        for before in [[]] + ([[variants[i] for i in rng.choice(shorter)]] if shorter else []):
            examples.append({"messages": render_prompt(task_source, quoted([*before, miss]), False, device),
                             "reply": miss["fix"]["reply"], "turn": len(before) + 2, "variant": miss["fix"]["variant"]})
    return examples


# ---------------------------------------------------------------- the model
def fresh_model(layers: int, hidden: int, seed: int):
    """A seeded random Qwen2 of the given size on the tiny model's tokenizer (head size 64, MLP 2 x hidden)."""
    tokenizer = AutoTokenizer.from_pretrained(build_tiny_model(), padding_side="left")
    heads = max(1, hidden // 64)
    shape = {"vocab_size": len(tokenizer), "hidden_size": hidden, "intermediate_size": 2 * hidden,
             "num_hidden_layers": layers, "num_attention_heads": heads, "num_key_value_heads": heads}
    return random_qwen2(tokenizer, shape, seed), tokenizer


def learning_rate(step: int, total: int, peak: float, warmup: int) -> float:
    """Linear warm-up, then cosine decay to 10% of the peak: a low final rate settles the memorised text."""
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


# ---------------------------------------------------------------- the check
@torch.no_grad()
def greedy_codes(model, tokenizer, prompts: list[dict], max_tokens: int, progress: bool) -> list[str | None]:
    """The code of the model's most likely reply to each prompt, in one left-padded batch (None: no code block);
    with `progress`, a bar over the reply tokens."""
    tokens = ChatTokens()
    tokens.tokenizer = tokenizer
    batch = tokenizer.pad({"input_ids": [tokens.prompt_token_ids(p["messages"]) for p in prompts]},
                          return_tensors="pt").to(model.device)
    config = model.generation_config
    with token_progress(max_tokens, len(prompts), progress) as step:
        out = model.generate(**batch, do_sample=False, max_new_tokens=max_tokens, pad_token_id=config.pad_token_id,
                             eos_token_id=config.eos_token_id, stopping_criteria=[step])
    texts = tokenizer.batch_decode(out[:, batch["input_ids"].shape[1]:], skip_special_tokens=True)
    return [parse_reply(text)[0] for text in texts]


def sampling_check(model, tokenizer, prompts: list[dict], library_codes: set[str], samples: int,
                   temperature: float, max_tokens: int, seed: int, progress: bool) -> list[dict]:
    """Per prompt, `samples` replies at the RL temperature (all in one batch, as train.py samples a group; each
    with a seed of its own, or they would all be one): how many parse, how many are a library variant word for
    word, how many distinct new kernels."""
    backend = HFBackend(model, temperature, max_tokens, tokenizer=tokenizer, progress=progress)
    count = len(prompts) * samples
    replies = backend.generate([p["messages"] for p in prompts for _ in range(samples)],
                               list(range(seed * count, (seed + 1) * count)))
    rows = []
    for n, prompt in enumerate(prompts):
        codes = [parse_reply(r.text)[0] for r in replies[n * samples:(n + 1) * samples]]
        rows.append({"task": prompt["task"], "turn": prompt["turn"], "samples": samples,
                     "parsed": sum(c is not None for c in codes),
                     "library": sum(c in library_codes for c in codes),
                     "new_kernels": len({c for c in codes if c is not None and c not in library_codes})})
    return rows


def _parser() -> argparse.ArgumentParser:
    """One flag per WarmStartConfig field (kevin/config_flags.py)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_config_flags(p, WarmStartConfig)
    return p


def parse_args(argv=None) -> WarmStartConfig:
    """The flags given, over WarmStartConfig's defaults; a bad value is a one-line error."""
    return parse_config(_parser(), WarmStartConfig, argv)


# ---------------------------------------------------------------- the run
def say(accelerator, message: str) -> None:
    """One line of progress on stderr, from the main process only: each phase can take minutes."""
    if accelerator.is_main_process:
        print(message, file=sys.stderr, flush=True)


def judge_library(variants: list[dict], tasks_folder: Path, device: str, turns: int, accelerator,
                  evals: list[dict] | None = None) -> None:
    """Give each variant its "score" and, where later turns quote feedback (turns > 1), its "eval": one
    evaluation on the main process, sent to every rank, unless `evals` (a resumed run's) are given; a verdict
    other than the file name's is a warning, and no correct variant judged correct is an error: the evaluator
    cannot run kernels on this machine, and a policy taught its feedback would learn that every kernel fails."""
    if turns == 1:
        for v in variants:
            v["score"] = 0.0
        return
    if evals is None:
        evals = [None]
        if accelerator.is_main_process:
            evals = [evaluate([{"task": v["task"], "code": v["code"]} for v in variants],
                              EvalConfig(device=device, tasks=str(tasks_folder)))]
        evals = broadcast_object_list(evals)[0]
    for v, result in zip(variants, evals):
        v["eval"], v["score"] = result, rewards.turn_score(result)
        if result["status"] != expected_status(v["variant"]):
            accelerator.print(f"warning: {v['variant']} was judged {result['status']}: {result['feedback'][:200]}")
    meant = [v for v in variants if expected_status(v["variant"]) == "correct"]
    if meant and not any(v["eval"]["status"] == "correct" for v in meant):
        first = " ".join(meant[0]["eval"]["feedback"].split())[:200]
        raise SystemExit(f"error: none of the library's {len(meant)} correct variants was judged correct on {device} "
                         f"({meant[0]['variant']}: {first})")


def judge_near_misses(variants: list[dict], count: int, tasks_folder: Path, device: str, accelerator,
                      evals: list[dict] | None = None) -> list[dict]:
    """`count` near misses of each variant judged correct (near_misses, seeded by its task and name, so that every
    rank and a resumed run draw the same), each with its "eval": one evaluation on the main process, sent to every
    rank, unless `evals` (a resumed run's) are given. All of them are returned; the caller keeps the wrong ones."""
    misses = [{"task": v["task"], "code": code, "summary": v["summary"], "fix": v}
              for v in variants if v["eval"]["status"] == "correct"
              for code in near_misses(v["code"], count, random.Random(v["variant"]))]
    if evals is None:
        evals = [None]
        if accelerator.is_main_process:
            evals = [evaluate([{"task": m["task"], "code": m["code"]} for m in misses],
                              EvalConfig(device=device, tasks=str(tasks_folder)))]
        evals = broadcast_object_list(evals)[0]
    for m, result in zip(misses, evals):
        m["eval"] = result
    return misses


def is_wrong(result: dict) -> bool:
    """A verdict a fix example may start from: the kernel was evaluated and is not correct."""
    return result["status"] != "correct" and not result.get("not_evaluated")


def load_model(args: WarmStartConfig):
    """(model, tokenizer): a fresh one for --model tiny, else the Hugging Face model to fine-tune."""
    if args.model == "tiny":
        return fresh_model(args.layers, args.hidden, args.seed)
    tokenizer = AutoTokenizer.from_pretrained(args.model, padding_side="left")
    return AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32), tokenizer


def training_samples(examples: list[dict], model, tokenizer) -> list[Sample]:
    """The examples as token ids, through the chat template; each reply ends with the end-of-turn token."""
    eos_id = model.generation_config.eos_token_id
    eos_id = eos_id[0] if isinstance(eos_id, list) else eos_id
    tokens = ChatTokens()
    tokens.tokenizer = tokenizer
    return [Sample(tokens.prompt_token_ids(e["messages"]),
                   tokenizer(e["reply"], add_special_tokens=False).input_ids + [eos_id], None, 0.0)
            for e in examples]


def load_checkpoint(args: WarmStartConfig) -> dict:
    """What this run goes on from: the checkpoint an interrupted run left in --out (its training flags must be
    these), else a fresh start with no steps done."""
    path, flags = Path(args.out) / CHECKPOINT, training_flags(args)
    if not path.exists():
        return {"flags": flags, "losses": []}
    checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    changed = next((k for k in flags if checkpoint["flags"].get(k) != flags[k]), None)
    if changed:
        raise SystemExit(f"error: --out {args.out} holds an interrupted run with --{changed.replace('_', '-')} "
                         f"{checkpoint['flags'].get(changed)}; give its flags to resume it, or another --out")
    return checkpoint


def save_checkpoint(path: Path, checkpoint: dict) -> None:
    """Written beside the last one, then renamed over it: a Ctrl-C or a crash while writing leaves that one whole."""
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(checkpoint, path.with_suffix(".tmp"))
    path.with_suffix(".tmp").replace(path)


def fine_tune(args: WarmStartConfig, accelerator, model, samples: list[Sample], pad_id: int, checkpoint: dict):
    """(model, mean loss per epoch): --epochs passes of the reply-token log-likelihood, the model unwrapped
    and in eval mode after. Goes on from `checkpoint` (a resumed run's losses, model and optimizer), kept
    current and saved every --save-every steps, after the last, and on a Ctrl-C after the step under way
    (whichever process had it), which then stops the run."""
    loader = torch.utils.data.DataLoader(samples, batch_size=args.batch_size, shuffle=True,
                                         collate_fn=lambda chunk: collate(chunk, pad_id))
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
    if "model" in checkpoint:
        model.load_state_dict(checkpoint.pop("model"))
        optimizer.load_state_dict(checkpoint.pop("optimizer"))
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    model.train()
    total = checkpoint["steps"] = args.epochs * len(loader)
    warmup = max(1, total // 20)
    losses, path = checkpoint["losses"], Path(args.out) / CHECKPOINT  # a loss per step done
    if losses:
        say(accelerator, f"resuming from {path} at step {len(losses)} of {total}")
    bar = tqdm(total=total, initial=len(losses), desc="warm start", unit="step",
               disable=not accelerator.is_main_process, file=sys.stderr)
    previous = signal.getsignal(signal.SIGINT)
    if previous is not signal.SIG_IGN:
        signal.signal(signal.SIGINT, lambda signum, frame: accelerator.set_trigger())
    try:
        for epoch in range(len(losses) // len(loader), args.epochs):
            set_seed(args.seed + epoch)  # the epoch's order from the seed and the epoch alone, resumed or not
            for batch in itertools.islice(loader, len(losses) - epoch * len(loader), None):
                for group in optimizer.param_groups:
                    group["lr"] = learning_rate(len(losses), total, args.lr, warmup)
                logprobs = token_logprobs(reply_logits(model, batch), batch["targets"], 1.0)
                loss = -logprobs[batch["reply_mask"]].mean()
                accelerator.backward(loss)
                accelerator.clip_grad_norm_(model.parameters(), 1.0)
                optimizer.step()
                optimizer.zero_grad()
                losses.append(loss.item())
                bar.update(1)
                stop = accelerator.check_trigger()  # on every process, so that all stop after the same step
                if (stop or len(losses) % args.save_every == 0 or len(losses) == total) and accelerator.is_main_process:
                    save_checkpoint(path, {**checkpoint, "model": accelerator.unwrap_model(model).state_dict(),
                                           "optimizer": optimizer.state_dict()})
                if stop:
                    raise KeyboardInterrupt
            bar.set_postfix(epoch=f"{epoch + 1}/{args.epochs}", loss=f"{sum(losses[-len(loader):]) / len(loader):.4f}")
    finally:
        signal.signal(signal.SIGINT, previous)
        bar.close()
    per_epoch = [sum(losses[i:i + len(loader)]) / len(loader) for i in range(0, total, len(loader))]
    return accelerator.unwrap_model(model).eval(), per_epoch


def check_prompts(examples: list[dict]) -> list[dict]:
    """One prompt per task and turn (the first example's): what the model is checked on after training."""
    prompts = []
    for task_id in sorted({e["task"] for e in examples}):
        for turn in sorted({e["turn"] for e in examples if e["task"] == task_id}):
            first = next(e for e in examples if e["task"] == task_id and e["turn"] == turn)
            prompts.append({"task": task_id, "turn": turn, "messages": first["messages"]})
    return prompts


def write_outputs(args: WarmStartConfig, model, tokenizer, variants: list[dict], report: dict) -> None:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    if args.turns > 1:
        with (out / "library_evals.jsonl").open("w") as f:
            for v in variants:
                f.write(json.dumps({"task": v["task"], "solution": v["variant"], "code": v["code"],
                                    "eval": v["eval"]}) + "\n")
    (out / "warm_start.json").write_text(json.dumps(report, indent=1))


def main(argv=None) -> None:
    """Run from the command line. A Ctrl-C says in one line what is saved (a re-run with the same --out resumes
    from it) and exits with status 130."""
    args = parse_args(argv)
    accelerator = Accelerator(cpu=not torch.cuda.is_available())
    checkpoint = load_checkpoint(args)
    started()  # from here on, a Ctrl-C is main's to report
    try:
        run(args, accelerator, checkpoint)
    except KeyboardInterrupt:  # evaluate has stopped its children; fine_tune has saved the step it finished
        path = Path(args.out) / CHECKPOINT
        if path.exists():
            say(accelerator, f"interrupted: step {len(checkpoint['losses'])} of {checkpoint['steps']} saved in {path}; "
                             "re-run with the same --out to resume")
        else:
            say(accelerator, "interrupted: before training, nothing saved")
        raise SystemExit(130) from None


def library_examples(args: WarmStartConfig, accelerator, checkpoint: dict, variants: list[dict]
                     ) -> tuple[list[dict], list[dict]]:
    """(every task's examples, the near misses judged): the library judged first (its statuses make the turns'
    feedback) and, for fix examples, its near misses; each verdict kept in `checkpoint` for a resumed run."""
    tasks = {task.id: task for task in load_tasks(str(args.tasks), None)}
    missing = sorted({v["task"] for v in variants} - set(tasks))
    if missing:
        raise SystemExit(f"error: --tasks {args.tasks} has no task {missing[0]} (named by the library's files)")
    if args.turns > 1 and "evals" not in checkpoint:
        say(accelerator, f"evaluating the library: {len(variants)} variants on {args.device}")
    judge_library(variants, args.tasks, args.device, args.turns, accelerator, checkpoint.get("evals"))
    checkpoint["evals"] = [v.get("eval") for v in variants]
    judged = []
    if args.turns > 1 and args.near_misses:
        if "miss_evals" not in checkpoint:
            say(accelerator, f"evaluating near misses: {args.near_misses} of each correct variant on {args.device}")
        judged = judge_near_misses(variants, args.near_misses, args.tasks, args.device, accelerator,
                                   checkpoint.get("miss_evals"))
        checkpoint["miss_evals"] = [m["eval"] for m in judged]
    misses = [m for m in judged if is_wrong(m["eval"])]
    rng = random.Random(args.seed)
    examples = []
    for task_id in sorted({v["task"] for v in variants}):
        mine = [v for v in variants if v["task"] == task_id]
        examples += [dict(e, task=task_id) for e in sft_examples(
            tasks[task_id].source, mine, args.turns, args.paths, args.device, rng,
            [m for m in misses if m["task"] == task_id])]
    return examples, judged


def run(args: WarmStartConfig, accelerator, checkpoint: dict) -> None:
    """Judge the library, build the examples and the model, fine-tune from `checkpoint`, check, write."""
    started = time.perf_counter()
    set_seed(args.seed)

    variants = load_library(args.library)
    examples, judged = library_examples(args, accelerator, checkpoint, variants)
    say(accelerator, f"{len(examples)} examples from {len(variants)} variants; fine-tuning {args.model} for "
                     f"{args.epochs} epochs")
    model, tokenizer = load_model(args)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    samples = training_samples(examples, model, tokenizer)
    longest_reply = max(len(s.reply_ids) for s in samples)
    model, losses = fine_tune(args, accelerator, model, samples, pad_id, checkpoint)

    library_codes = {v["code"] for v in variants}
    prompts = check_prompts(examples)
    main_process = accelerator.is_main_process
    say(accelerator, f"check: greedy replies to {len(prompts)} prompts")
    greedy = [code in library_codes for code in greedy_codes(model, tokenizer, prompts, longest_reply + 16,
                                                             main_process)]
    check = []
    if args.check_samples:
        say(accelerator, f"check: {args.check_samples} sampled replies to each of {len(prompts)} prompts")
        check = sampling_check(model, tokenizer, prompts, library_codes, args.check_samples, args.temperature,
                               longest_reply + 16, args.seed, main_process)
    if accelerator.is_main_process:
        per_turn = {t: sum(e["turn"] == t for e in examples) for t in sorted({e["turn"] for e in examples})}
        report = {
            "model": {"source": args.model, "layers": model.config.num_hidden_layers,
                      "hidden": model.config.hidden_size, "parameters": sum(p.numel() for p in model.parameters())},
            "library": [{"variant": v["variant"], "status": v.get("eval", {}).get("status"),
                         "speedup": v.get("eval", {}).get("speedup"), "score": v["score"],
                         "reply_tokens": len(tokenizer(v["reply"], add_special_tokens=False).input_ids) + 1}
                        for v in variants],
            "near_misses": [{"fix": m["fix"]["variant"], "status": m["eval"]["status"],
                             "feedback": m["eval"]["feedback"].splitlines()[0][:200] if m["eval"]["feedback"] else ""}
                            for m in judged],
            "examples_per_turn": per_turn, "longest_reply_tokens": longest_reply,
            "loss_per_epoch": losses, "greedy_is_library": dict(zip((f"{p['task']} turn {p['turn']}"
                                                                     for p in prompts), greedy)),
            "sampling_check": check, "seconds": round(time.perf_counter() - started, 1), "args": {
                k: shown(v) if isinstance(v, Path) else v for k, v in vars(args).items()}}
        write_outputs(args, model, tokenizer, variants, report)
        accelerator.print(summary_table(report))
        accelerator.print(f"model: {Path(args.out)}   report: {Path(args.out) / 'warm_start.json'}")
        (Path(args.out) / CHECKPOINT).unlink()  # the run is done: nothing to resume


def summary_table(report: dict) -> str:
    """The library as the evaluator judged it, the examples, the loss, and what the model now writes."""
    lines = [f"{'variant':<44} {'status':>14} {'speedup':>8} {'score':>6} {'tokens':>7}"]
    for v in report["library"]:
        speedup = f"{v['speedup']:.2f}x" if v["speedup"] is not None else "-"
        lines.append(f"{v['variant']:<44} {v['status'] or 'not run':>14} {speedup:>8} {v['score']:>6.2f} "
                     f"{v['reply_tokens']:>7}")
    if report["near_misses"]:
        statuses = [m["status"] for m in report["near_misses"]]
        lines.append(f"near misses: {len(statuses)}, " + ", ".join(f"{s} {statuses.count(s)}" for s in sorted(
            set(statuses))) + " (the wrong ones are the first attempts of fix examples)")
    lines.append("examples per turn: " + ", ".join(f"turn {t}: {n}" for t, n in report["examples_per_turn"].items()))
    lines.append(f"loss: {report['loss_per_epoch'][0]:.4f} (first epoch) -> {report['loss_per_epoch'][-1]:.5f} (last)")
    greedy = report["greedy_is_library"]
    lines.append(f"greedy reply is a library variant: {sum(greedy.values())} of {len(greedy)} check prompts")
    if report["sampling_check"]:
        lines.append(f"{'task':<16} {'turn':>4} {'samples':>8} {'parsed':>7} {'library':>8} {'new kernels':>12}")
        for r in report["sampling_check"]:
            lines.append(f"{r['task']:<16} {r['turn']:>4} {r['samples']:>8} {r['parsed']:>7} {r['library']:>8} "
                         f"{r['new_kernels']:>12}")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
