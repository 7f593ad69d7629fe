"""One GRPO update, Hugging Face TRL's GRPOTrainer against train.py's, on the same random model, batch and
settings: tokens/s and peak GPU memory for each reply length, model shape and mode, and the longest reply
that each side fits.

Both sides get one group of S samples of a 1,024-token prompt and R reply tokens (random ids of the tiny
tokenizer, fixed advantages, old log-probs -log(vocabulary), so ratios start near 1) and take the paper's
settings: beta 0, the Dr. GRPO normaliser (R), eps 0.2 / 0.28, temperature 0.9, lr 2e-6 constant, grad norm
clipped at 0.05, fused AdamW (transformers' default; DeepSpeed's CPU Adam under ZeRO offload), 2 optimizer
steps per batch, bf16 autocast over fp32 weights (bf16 weights under ZeRO-3, whose optimizer keeps the fp32
copy), gradient checkpointing, micro-batches of M samples accumulated over the batch. Each side does the same
work, and the row shows it:
  trl      GRPOTrainer.train() for 2 + 2K optimizer steps, its generation bypassed: _generate_and_score_completions
           returns the pre-built batch (no prompt truncation, no old log-prob pass: they are given), which
           num_iterations 2 reuses for 2 steps, split into S / M micro-batches (steps_per_generation = the
           gradient accumulation); token-level importance ratios; its fused LM head scores the R completion
           positions only. Timed: K windows of 2 optimizer steps, on_step_begin of step 3 to on_step_end of
           step 4 the first (the bypassed call, TRL's own metrics and its logging included).
  project  train.py's own setup() and update() on the same batch written as a --rollouts file: step 1's
           update warms up, then K more update() calls (2 optimizer steps each) are timed, one a window.
In each timed window each side counts the policy's forward passes and their tokens (a hook on the input
embeddings) and the optimizer steps; tokens/s is a window's tokens over the median window's seconds, of K =
--repeats windows in each of --rounds processes a side, run TRL, project, project, TRL, ... (both sides wait on
the host at these sizes, and the host's speed drifts: on the H200 two processes of the same side minutes apart
ran 20% apart, and single windows swing by a third), and the rows of both sides must show the same three
counts a window (2 x S / M forwards of M x (1,024 + R) tokens, 2 steps). Loss (the mean over the first
window's 2 steps: TRL's logged losses, train.py's summed micro-batch losses) and each of its steps' gradient
norm (before clipping) are recorded for both: equal work gives equal numbers. Beside the pooled ratio the table
gives each round's, from its two back-to-back processes, and each side's fastest process over its slowest (the
same code run again): how finely the ratio is measured.
S and M are chosen per length (--tokens-per-update) so that each row takes seconds: tokens/s and peak memory
need no 64 samples at 16K. Peak memory is torch's peak allocation over the timed windows (weights, gradients,
optimizer state, activations). Each measurement runs in a fresh process, launched as its mode needs
(`accelerate launch --config_file configs/deepspeed_zero3.yaml` for zero3_offload): no side inherits the
other's allocator, Accelerate's GradientState (shared by every Accelerator of a process: left set by one
trainer, it makes the next zero its gradients at every micro-batch) or an out-of-memory error. A process
that fails makes a row with fits false, tokens_per_s and peak_gib null and its first exception (or how it
was killed) as the error (peak_gib is null on the CPU too: torch measures GPU memory only). The longest reply
that fits is the longest length of a side's rows that ran; --probe-longest adds a row at 32,768 - prompt
tokens (the random model's positions) where the listed lengths all fit.

    python bench/grpo_step.py --out results/grpo_step_h200.json                 # every row, on the GPU machine
    python bench/grpo_step.py --rows 0.5b:full:512 7b:lora:16384 --out ...       # some rows
    python bench/grpo_step.py --rows tiny:full:16 tiny:lora:64 --out /tmp/grpo_step.json   # the CPU, toy sizes

Rows are written to --out as each finishes (a JSON list); a re-run skips the rows already there. TRL is a
benchmark-only dependency (docs/training.md: carried wheels), as is DeepSpeed for zero3_offload. Rows: model ("tiny",
"0.5b", "7b": Qwen2.5-7B's shape, untied embeddings, 7.6B parameters), mode ("full", "lora" rank 16 on
every linear layer, "zero3_offload"), reply_tokens, side, tokens_per_s, peak_gib, fits, the batch
(prompt_tokens, samples, micro_batch), the work counted (forwards, forward_tokens, optimizer_steps), loss,
grad_norms, window_s (every window's seconds, process after process), processes, host_peak_gib (the
process's peak resident memory: where ZeRO-Offload keeps the optimizer), wall_s, error, and the project's
memory_gib: what its update says held its first window's peak (weights, gradients, optimizer, activations; GPU).
"""
import argparse
import importlib.util
import json
import math
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # train.py's update is what this measures: the stage script, which no install holds

import torch  # noqa: E402
from torch.optim.optimizer import register_optimizer_step_post_hook  # noqa: E402

from kevin import tiny_model  # noqa: E402
import train  # noqa: E402

SHAPES = {"tiny": {"hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 2, "num_attention_heads": 2,
                   "num_key_value_heads": 2},
          "0.5b": tiny_model.QWEN2_05B_SHAPE,
          "7b": {"vocab_size": 152064, "hidden_size": 3584, "intermediate_size": 18944, "num_hidden_layers": 28,
                 "num_attention_heads": 28, "num_key_value_heads": 4, "rope_theta": 1e6, "rms_norm_eps": 1e-6,
                 "tie_word_embeddings": False}}
GPU_ROWS = [f"{model}:{mode}:{reply}" for model, mode in [("0.5b", "full"), ("7b", "lora"), ("0.5b", "zero3_offload")]
            for reply in (512, 4096, 16384)] + ["7b:zero3_offload:16384"]
CPU_ROWS = [f"tiny:{mode}:{reply}" for mode in ("full", "lora") for reply in (16, 64)]
POSITIONS = 32768  # tiny_model.random_qwen2's max_position_embeddings
LORA_RANK = 16
DEFAULTS = train.parse_args([])  # the paper's settings, as train.py has them


def parse_args(argv=None):
    on_gpu = torch.cuda.is_available()
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", nargs="+", default=GPU_ROWS if on_gpu else CPU_ROWS,
                   help="MODEL:MODE:REPLY_TOKENS rows to run (default: 0.5b full, 7b lora and 0.5b zero3_offload at "
                        "512, 4096 and 16384 and 7b zero3_offload at 16384 on a GPU; tiny full and lora at 16 and 64 "
                        "on the CPU)")
    p.add_argument("--sides", nargs="+", choices=["trl", "project"], default=["trl", "project"], help="who to run")
    p.add_argument("--prompt-tokens", type=int, default=1024 if on_gpu else 32, help="prompt length of every sample")
    p.add_argument("--tokens-per-update", type=int, default=16384 if on_gpu else 256,
                   help="about this many tokens a batch: S = max(2, this // (prompt + reply)) samples")
    p.add_argument("--tokens-per-micro-batch", type=int, default=8192 if on_gpu else 128,
                   help="about this many tokens a forward pass: M = max(1, this // (prompt + reply)) samples")
    p.add_argument("--logprob-chunk", type=int, default=DEFAULTS.logprob_chunk,
                   help="train.py's --logprob-chunk on the project's side: reply tokens whose logits its output "
                        "layer makes a vocabulary tile at a time")
    p.add_argument("--repeats", type=int, default=3, help="timed windows of 2 optimizer steps a process; the median's "
                   "seconds make tokens/s")
    p.add_argument("--rounds", type=int, default=2 if on_gpu else 1,
                   help="fresh processes a side, in the order TRL, project, project, TRL, ... (a drift in the "
                        "machine's speed during a row touches both sides alike); a side's windows from all of its "
                        "processes make its median (default 2 on a GPU, 1 on the CPU)")
    p.add_argument("--profile", metavar="DIR", help="write each side's profile of its first timed window (ops "
                   "and kernels by their own GPU time, then by host time: a side that waits on the host shows there) "
                   "to DIR/MODEL-MODE-REPLY-SIDE.txt, its timeline to .trace.json (chrome://tracing, Perfetto) and "
                   "its output to .stderr.txt; profiled times are not comparable")
    p.add_argument("--probe-longest", action="store_true",
                   help=f"also try a reply of {POSITIONS} - prompt tokens where every listed length of a model and "
                        "mode fitted")
    p.add_argument("--out", default=str(REPO / "results" / "grpo_step.json"), help="rows as a JSON list")
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)  # one measurement, in its own process
    args = p.parse_args(argv)
    for flag in ("repeats", "rounds"):
        if getattr(args, flag) < 1:
            raise SystemExit(f"--{flag} {getattr(args, flag)}: at least 1")
    if args.profile:
        Path(args.profile).mkdir(parents=True, exist_ok=True)
    for row in args.rows:
        model, mode, reply = (row.split(":") + ["", ""])[:3]
        if model not in SHAPES or mode not in ("full", "lora", "zero3_offload") or not reply.isdigit():
            raise SystemExit(f"--rows {row}: want MODEL:MODE:REPLY_TOKENS, MODEL of {list(SHAPES)}, MODE of full, "
                             "lora, zero3_offload")
        if mode == "zero3_offload" and not on_gpu:
            raise SystemExit(f"--rows {row}: zero3_offload needs a GPU (DeepSpeed)")
        if args.prompt_tokens + int(reply) > POSITIONS:
            raise SystemExit(f"--rows {row}: prompt + reply is over the model's {POSITIONS} positions")
    if "trl" in args.sides and not args.child and importlib.util.find_spec("trl") is None:  # not rows of failures
        raise SystemExit("error: --sides trl, but TRL is not installed (pip install trl; docs/training.md); "
                         "--sides project runs train.py's side alone")
    return args


# ---------------------------------------------------------------- the batch, the same for both sides
def batch_sizes(args, reply: int) -> tuple[int, int]:
    """(samples S, micro-batch M): S a multiple of M, so both sides accumulate over the same micro-batches."""
    micro = max(1, args.tokens_per_micro_batch // (args.prompt_tokens + reply))
    return max(2, math.ceil(args.tokens_per_update // (args.prompt_tokens + reply) / micro)) * micro, micro


def build_batch(tokenizer, vocab: int, samples: int, prompt_tokens: int, reply: int) -> dict:
    """One prompt, `samples` replies of `reply` random ordinary token ids, seeded advantages."""
    g = torch.Generator().manual_seed(0)
    low, high = len(tiny_model.SPECIAL_TOKENS), len(tokenizer)
    return {"prompt": torch.randint(low, high, (prompt_tokens,), generator=g).tolist(),
            "replies": torch.randint(low, high, (samples, reply), generator=g).tolist(),
            "advantages": torch.randn(samples, generator=g).tolist(), "old_logprob": -math.log(vocab)}


def model_path(name: str) -> str:
    """The random model of this shape (bf16 on disk but the tiny one), written once, on the GPU if there is one."""
    path = REPO / ".cache" / f"grpo-step-{name}"
    if not tiny_model.is_built(path):
        tokenizer = tiny_model.train_tokenizer(tiny_model.corpus_files())
        shape = {"vocab_size": len(tokenizer), **SHAPES[name]}
        with torch.device("cuda" if torch.cuda.is_available() else "cpu"):  # initialising 7B on a CPU takes minutes
            tiny_model.write_model(path, tokenizer, shape, "float32" if name == "tiny" else "bfloat16")
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    return str(path)


# ---------------------------------------------------------------- the two sides (each in its own process)
def run_project(spec: dict, batch: dict, work: Path) -> dict:
    """train.py's setup() and update(): step 1 warms up, then each of --repeats update() calls is a window."""
    turn = {"turn": 0, "prompt": {"messages": [], "token_ids": batch["prompt"]}, "code": "", "summary": "",
            "eval": {"status": "correct", "compiled": True, "correct": True, "speedup": 1.0, "feedback": ""}}
    records = [{"task": f"bench/step{step}", "trajectory": k, "turns": [{
        **turn, "reply": {"text": "", "token_ids": ids, "logprobs": [batch["old_logprob"]] * len(ids)},
        "score": a, "return": a, "advantage": a}]}
        for step in (1, 2) for k, (ids, a) in enumerate(zip(batch["replies"], batch["advantages"]))]
    rollouts = work / "rollouts.jsonl"
    rollouts.write_text("".join(json.dumps(r) + "\n" for r in records))
    args = train.parse_args(["--model", spec["path"], "--rollouts", str(rollouts), "--tasks-per-step", "1",
                             "--max-tokens", str(spec["reply_tokens"]), "--micro-batch-size", str(spec["micro_batch"]),
                             "--gradient-checkpointing", "--logprob-chunk", str(spec["logprob_chunk"]),
                             "--out", str(work / "project"),
                             "--bf16" if spec["bf16"] else "--no-bf16",
                             *(["--lora-rank", str(LORA_RANK)] if spec["mode"] == "lora" else [])])
    run = train.setup(args)
    work_done = Work(run.accelerator.unwrap_model(run.model), spec["profile"])
    train.update(args, run, 0, train.step_rollouts(args, run, 0))
    rollouts, windows = train.step_rollouts(args, run, 1), []
    for _ in range(spec["repeats"]):
        work_done.begin()
        windows.append(train.update(args, run, 1, rollouts))
        work_done.end()
    first, peaks = windows[0], [update.memory.get("memory/peak_gib") for update in windows]
    return {**work_done.counts(), "peak_gib": None if None in peaks else max(peaks),
            "loss": first.totals[0].item() / args.updates_per_batch, "grad_norms": first.grad_norms,
            "memory_gib": {k.removeprefix("memory/").removesuffix("_gib"): round(v, 3)
                           for k, v in first.memory.items()}}


def run_trl(spec: dict, batch: dict, work: Path) -> dict:
    """GRPOTrainer.train() for 2 + 2 x --repeats optimizer steps on the pre-built batch: from step 3 on, each
    pair of steps is a window."""
    from datasets import Dataset
    from transformers import AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    samples, micro, reply = len(batch["replies"]), spec["micro_batch"], spec["reply_tokens"]
    cuda = torch.cuda.is_available()
    device = "cuda" if cuda else "cpu"
    completion_ids = torch.tensor(batch["replies"], device=device)
    prompt_ids = torch.tensor([batch["prompt"]] * samples, device=device)
    inputs = {"prompt_ids": prompt_ids, "prompt_mask": torch.ones_like(prompt_ids),
              "completion_ids": completion_ids, "completion_mask": torch.ones_like(completion_ids),
              "advantages": torch.tensor(batch["advantages"], device=device),
              "old_per_token_logps": torch.full(completion_ids.shape, batch["old_logprob"], device=device),
              "num_items_in_batch": torch.tensor(completion_ids.numel(), device=device)}
    offload = spec["mode"] == "zero3_offload"
    if offload:  # the launch config's placeholders, which train.py overrides: the Trainer refuses a mismatch
        os.environ.update(ACCELERATE_GRADIENT_ACCUMULATION_STEPS="auto", ACCELERATE_GRADIENT_CLIPPING="auto")

    class BypassedGRPOTrainer(GRPOTrainer):
        def _generate_and_score_completions(self, generation_batch):
            return dict(inputs)

        def create_optimizer(self, *args, **kwargs):  # ZeRO-Offload takes DeepSpeed's CPU Adam only
            if offload and self.optimizer is None:
                from deepspeed.ops.adam import DeepSpeedCPUAdam

                self.optimizer = DeepSpeedCPUAdam([p for p in self.model.parameters() if p.requires_grad],
                                                  lr=DEFAULTS.lr, weight_decay=DEFAULTS.weight_decay, adamw_mode=True)
            return super().create_optimizer(*args, **kwargs)

    class Measure(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            if state.global_step == 2 and cuda:
                torch.cuda.reset_peak_memory_stats()
            if state.global_step >= 2 and state.global_step % 2 == 0:
                work_done.begin()

        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step > 2 and state.global_step % 2 == 0:
                work_done.end()

    config = GRPOConfig(
        output_dir=str(work / "trl"), per_device_train_batch_size=micro, gradient_accumulation_steps=samples // micro,
        num_generations=samples, max_completion_length=reply, num_iterations=DEFAULTS.updates_per_batch,
        max_steps=2 + 2 * spec["repeats"],
        beta=DEFAULTS.beta, loss_type="dr_grpo", epsilon=DEFAULTS.eps_low, epsilon_high=DEFAULTS.eps_high,
        temperature=DEFAULTS.temperature, learning_rate=DEFAULTS.lr, lr_scheduler_type="constant",
        weight_decay=DEFAULTS.weight_decay, optim="adamw_torch_fused", max_grad_norm=DEFAULTS.max_grad_norm,
        bf16=spec["bf16"], use_cpu=not cuda, gradient_checkpointing=True,
        gradient_checkpointing_kwargs={"use_reentrant": False},
        model_init_kwargs={"dtype": "bfloat16" if offload else "float32"},  # as train.py loads it
        save_strategy="no", report_to="none", logging_steps=1, disable_tqdm=True, shuffle_dataset=False,
        dataloader_num_workers=0, log_completions=False, seed=0)
    peft_config = None
    if spec["mode"] == "lora":
        from peft import LoraConfig

        peft_config = LoraConfig(r=LORA_RANK, lora_alpha=2 * LORA_RANK, target_modules="all-linear",
                                 task_type="CAUSAL_LM")
    trainer = BypassedGRPOTrainer(model=spec["path"], reward_funcs=lambda completions, **kw: [0.0] * len(completions),
                                  args=config, train_dataset=Dataset.from_dict({"prompt": ["p"] * 4}),
                                  processing_class=AutoTokenizer.from_pretrained(spec["path"]), callbacks=[Measure()],
                                  peft_config=peft_config)
    work_done = Work(trainer.model, spec["profile"])
    trainer.train()
    timed = [h for h in trainer.state.log_history if h.get("step") in (3, 4) and "loss" in h]
    return {**work_done.counts(),
            "peak_gib": torch.cuda.max_memory_allocated() / 2**30 if cuda else None,
            "loss": sum(h["loss"] for h in timed) / len(timed), "grad_norms": [h["grad_norm"] for h in timed]}


class Work:
    """What a side did in its timed windows (each `begin` to `end`, the GPU synchronised at both): their
    seconds, and a window's forward passes of the policy and their tokens (counted at the input embeddings) and
    optimizer steps (any optimizer's). So the two sides' numbers are shown to cover the same work, and tokens/s
    is a window's tokens over the median window's seconds. With `profile`, a path, the first window's ops and
    kernels by their own time go there (torch.profiler: the row's times are not then comparable with an
    unprofiled one's)."""

    def __init__(self, model, profile: str | None = None):
        self.on, self.forwards, self.tokens, self.steps, self.windows = False, 0, 0, 0, []
        model.get_input_embeddings().register_forward_hook(self.count_forward)
        register_optimizer_step_post_hook(self.count_step)
        self.profile, self.profiler = profile, None

    def begin(self) -> None:
        synchronize()
        self.on = True
        if self.profile and not self.windows:
            activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
            self.profiler = torch.profiler.profile(activities=activities[:1 + torch.cuda.is_available()])
            self.profiler.__enter__()
        self.started = time.perf_counter()

    def end(self) -> None:
        synchronize()
        self.windows.append(time.perf_counter() - self.started)
        self.on = False
        if self.profiler:
            self.profiler.__exit__(None, None, None)
            ops = self.profiler.key_averages()
            tables = [ops.table(sort_by=by, row_limit=40) for by in
                      ("self_cuda_time_total", "cpu_time_total")[not torch.cuda.is_available():]]
            Path(self.profile).write_text("\n".join(tables))
            self.profiler.export_chrome_trace(str(Path(self.profile).with_suffix(".trace.json")))  # the gaps: when
            self.profiler = None  # the GPU waited, and on what

    def count_forward(self, module, args, output):
        if self.on:
            self.forwards, self.tokens = self.forwards + 1, self.tokens + args[0].numel()

    def count_step(self, optimizer, args, kwargs):
        self.steps += self.on

    def counts(self) -> dict:
        k = len(self.windows)
        return {"seconds": statistics.median(self.windows), "window_s": [round(w, 4) for w in self.windows],
                "forwards": self.forwards // k, "forward_tokens": self.tokens // k, "optimizer_steps": self.steps // k}


def synchronize() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def child(spec: dict) -> None:
    """One side of one row; prints `ROW {json}`. Running out of GPU memory is a row with peak_gib null."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(spec["path"])
    vocab = json.loads((Path(spec["path"]) / "config.json").read_text())["vocab_size"]
    batch = build_batch(tokenizer, vocab, spec["samples"], spec["prompt_tokens"], spec["reply_tokens"])
    with tempfile.TemporaryDirectory(prefix="grpo_step_") as work:
        try:
            result = (run_trl if spec["side"] == "trl" else run_project)(spec, batch, Path(work))
        except torch.OutOfMemoryError as error:
            result = {"seconds": None, "peak_gib": None, "error": f"out of GPU memory: {str(error)[:200]}"}
    result["tokens_per_s"] = result["forward_tokens"] / result["seconds"] if result["seconds"] else None
    result["host_peak_gib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # from KiB
    print("ROW " + json.dumps(result), flush=True)


# ---------------------------------------------------------------- the table
def measure(args, model: str, mode: str, reply: int, side: str) -> dict:
    samples, micro = batch_sizes(args, reply)
    spec = {"model": model, "mode": mode, "reply_tokens": reply, "side": side, "path": model_path(model),
            "prompt_tokens": args.prompt_tokens, "samples": samples, "micro_batch": micro,
            "bf16": torch.cuda.is_available(), "logprob_chunk": args.logprob_chunk, "repeats": args.repeats,
            "profile": str(Path(args.profile) / f"{model}-{mode}-{reply}-{side}.txt") if args.profile else None}
    launcher = [sys.executable]
    if mode == "zero3_offload":
        launcher = [sys.executable, "-m", "accelerate.commands.launch", "--config_file",
                    str(REPO / "configs" / "deepspeed_zero3.yaml"), "--num_processes", "1", "--mixed_precision", "bf16"]
    started = time.perf_counter()
    done = subprocess.run([*launcher, str(Path(__file__).resolve()), "--child", json.dumps(spec)], cwd=REPO,
                          capture_output=True, text=True)
    lines = [line for line in done.stdout.splitlines() if line.startswith("ROW ")]
    result = json.loads(lines[-1][4:]) if lines else {
        "tokens_per_s": None, "peak_gib": None, "error": f"exit {done.returncode}: {first_error(done.stderr)}"}
    row = {"model": model, "mode": mode, "reply_tokens": reply, "side": side, "tokens_per_s": result["tokens_per_s"],
           "peak_gib": result["peak_gib"], "fits": "error" not in result, "prompt_tokens": args.prompt_tokens,
           "samples": samples, "micro_batch": micro,
           **({"logprob_chunk": args.logprob_chunk, "memory_gib": result.get("memory_gib")}
              if side == "project" else {}),
           **{k: result.get(k) for k in ("forwards", "forward_tokens", "optimizer_steps", "loss", "grad_norms",
                                         "window_s", "host_peak_gib")},
           "wall_s": round(time.perf_counter() - started, 1), **({"error": result["error"]} if "error" in result else {})}
    if "error" in result:
        print(f"  {side}: {result.get('error')}\n{done.stderr[-2000:]}", file=sys.stderr)
    if spec["profile"]:  # what the side's libraries said (DeepSpeed's warnings among it)
        Path(spec["profile"]).with_suffix(".stderr.txt").write_text(done.stderr)
    return row


def pooled(runs: list[dict]) -> dict:
    """One side's row from its processes: tokens/s over the median of all their windows, the highest peak, every
    window's seconds; the work counted, loss and gradient norms of the first (every process does the same work)."""
    first, failed = runs[0], [r for r in runs if not r["fits"]]
    if failed:
        return {**failed[0], "processes": len(runs)}
    windows = [w for r in runs for w in r["window_s"]]
    return {**first, "tokens_per_s": first["forward_tokens"] / statistics.median(windows),
            "peak_gib": None if None in (r["peak_gib"] for r in runs) else max(r["peak_gib"] for r in runs),
            "window_s": windows, "host_peak_gib": max(r["host_peak_gib"] for r in runs),
            "wall_s": round(sum(r["wall_s"] for r in runs), 1), "processes": len(runs)}


def first_error(stderr: str) -> str:
    """The child's own error: the exception line of its first traceback (the cause, where one error led to
    others), else a line that says how it died (a signal: out of host memory?), else its last line. A launcher
    (torchrun, under accelerate launch) ends the output with its own banner, which says only that a child failed."""
    lines = [re.sub(r"^\[rank\d+\]:\s?", "", line).rstrip() for line in stderr.splitlines()]
    start = next((i for i, line in enumerate(lines) if line.startswith("Traceback (most recent call last)")), None)
    if start is not None:
        found = next((line for line in lines[start + 1:] if line and not line[0].isspace()), None)
        if found:
            return found[:300]
    died = [line for line in lines if re.search(r"Signal \d+|SIG[A-Z]+|Killed|exitcode", line)]
    if died:
        return died[0].strip()[:300]
    rest = [line for line in lines if line.strip(" =-")]
    return rest[-1].strip()[:300] if rest else ""


def process_speeds(row: dict) -> list[float]:
    """A side's tokens/s in each of its processes, from the median of that process's windows."""
    n = len(row["window_s"]) // row["processes"]
    return [row["forward_tokens"] / statistics.median(row["window_s"][i * n:(i + 1) * n])
            for i in range(row["processes"])]


def round_ratios(trl: dict, own: dict) -> list[float]:
    """Project over TRL tokens/s, one for each round: the medians of the two processes that ran back to back
    (TRL then project, project then TRL, ...). Where the host's speed drifts, their spread is the resolution of
    the pooled ratio."""
    if not (trl.get("tokens_per_s") and own.get("tokens_per_s")) or trl["processes"] != own["processes"]:
        return []
    return [mine / theirs for mine, theirs in zip(process_speeds(own), process_speeds(trl))]


def drift(row: dict) -> float | None:
    """The fastest of a side's processes over its slowest: the same code, run again minutes apart. A difference
    between the sides smaller than this is not resolved by the row."""
    speeds = process_speeds(row) if row.get("tokens_per_s") and row["processes"] > 1 else []
    return max(speeds) / min(speeds) if speeds else None


def table(rows: list[dict]) -> str:
    """Side by side per model, mode and length, with project/TRL ratios; then the longest reply each side fits."""
    def key(r):
        return r["model"], r["mode"], r["reply_tokens"]

    def num(x, fmt, unit=""):
        return format(x, fmt) + unit if x is not None else "-"

    by = {(key(r), r["side"]): r for r in rows}
    lines = ["| model | mode | reply tokens | TRL tokens/s | project tokens/s | ratio | ratio per round | TRL peak GiB "
             "| project peak GiB | ratio | process to process, TRL and project |", "|---" * 11 + "|"]
    for k in sorted({key(r) for r in rows}, key=lambda k: (list(SHAPES).index(k[0]), k[1], k[2])):
        trl, own = by.get((k, "trl"), {}), by.get((k, "project"), {})
        speed = own["tokens_per_s"] / trl["tokens_per_s"] if trl.get("tokens_per_s") and own.get("tokens_per_s") else None
        memory = own["peak_gib"] / trl["peak_gib"] if trl.get("peak_gib") and own.get("peak_gib") else None
        rounds = ", ".join(f"{r:.2f}" for r in round_ratios(trl, own)) or "-"
        lines.append(f"| {k[0]} | {k[1]} | {k[2]} | {num(trl.get('tokens_per_s'), ',.0f')} | "
                     f"{num(own.get('tokens_per_s'), ',.0f')} | {num(speed, '.2f', 'x')} | {rounds} | "
                     f"{num(trl.get('peak_gib'), '.2f')} | {num(own.get('peak_gib'), '.2f')} | "
                     f"{num(memory, '.3f', 'x')} |"  # 0.1 GiB of 40 shows
                     f" {num(drift(trl), '.2f')}, {num(drift(own), '.2f')} |")
    lines.append("")
    for model, mode in sorted({k[:2] for k in map(key, rows)}):
        longest = {side: max((r["reply_tokens"] for r in rows if key(r)[:2] == (model, mode) and r["side"] == side
                              and r["fits"]), default=None) for side in ("trl", "project")}
        lines.append(f"longest reply that fits, {model} {mode}: TRL {longest['trl']}, project {longest['project']} "
                     "(of the lengths tried)")
    return "\n".join(lines)


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.child:
        return child(json.loads(args.child))
    out = Path(args.out)
    rows = json.loads(out.read_text()) if out.exists() else []
    done = {(r["model"], r["mode"], r["reply_tokens"], r["side"]) for r in rows}
    wanted = [(m, mode, int(reply)) for m, mode, reply in (row.split(":") for row in args.rows)]
    if args.probe_longest:
        wanted += sorted({(m, mode, POSITIONS - args.prompt_tokens) for m, mode, _ in wanted})
    for model, mode, reply in wanted:
        sides = [side for side in args.sides if (model, mode, reply, side) not in done and not (
            reply == POSITIONS - args.prompt_tokens and any(  # probe only beyond lengths that all fitted
                not r["fits"] for r in rows if (r["model"], r["mode"], r["side"]) == (model, mode, side)))]
        runs = {side: [] for side in sides}
        for round_index in range(args.rounds):
            for side in sides if round_index % 2 == 0 else sides[::-1]:
                print(f"{model} {mode} reply {reply}: {side}, process {round_index + 1} of {args.rounds} ...",
                      file=sys.stderr, flush=True)
                runs[side].append(measure(args, model, mode, reply, side))
        rows += [pooled(runs[side]) for side in sides]
        out.parent.mkdir(parents=True, exist_ok=True)
        out.with_suffix(".tmp").write_text(json.dumps(rows, indent=1))
        out.with_suffix(".tmp").replace(out)
    print(table(rows))
    print(f"rows: {out.relative_to(REPO) if out.is_relative_to(REPO) else out}")


if __name__ == "__main__":
    main()
