"""train.py's machinery: the Accelerator for a launch config, the policy and its optimizer as accelerate prepares
them, the policy switched to generation, the output folder (locked, and what an earlier run left in it), and what
the GPU holds during an update."""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import signal
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import torch
from accelerate import Accelerator
from accelerate.utils import DistributedType, ProjectConfiguration
from transformers import AutoModelForCausalLM

from kevin.batching import put_logprob_head


@contextmanager
def policy_for_generation(accelerator, model):
    """The policy as a plain transformers model in eval mode (KV cache on, gradient checkpointing off).

    Under FSDP 2 and ZeRO-3 the unwrapped model still gathers each layer's parameters in its forward
    pass, so every rank must run as many passes as the others: generation then uses synced_gpus."""
    model.eval()
    try:
        yield accelerator.unwrap_model(model)
    finally:
        model.train()


def is_sharded(accelerator) -> bool:
    """FSDP or ZeRO-3: parameters live in shards and every forward pass is a collective."""
    plugin = accelerator.state.deepspeed_plugin
    return accelerator.distributed_type == DistributedType.FSDP or (plugin is not None and plugin.zero_stage == 3)


def make_accelerator(args, accumulation: int, on_gpu: bool) -> Accelerator:
    """The Accelerator for the launch config (DDP, FSDP 2, ZeRO-3), refusing what the loop does not support."""
    # Micro-batches per update come from --micro-batch-size, not from the launch config (DeepSpeed reads these).
    os.environ["ACCELERATE_GRADIENT_ACCUMULATION_STEPS"] = str(accumulation)
    os.environ["ACCELERATE_GRADIENT_CLIPPING"] = str(args.max_grad_norm)
    output_dir = Path(args.out)
    accelerator = Accelerator(cpu=not on_gpu, mixed_precision="bf16" if args.bf16 else "no",
                              gradient_accumulation_steps=accumulation,
                              log_with=None if args.report_to == "none" else args.report_to,
                              project_config=ProjectConfiguration(project_dir=str(output_dir),
                                                                  logging_dir=str(output_dir / "logs")))
    if accelerator.distributed_type == DistributedType.FSDP and not accelerator.is_fsdp2:
        raise SystemExit("error: FSDP 1 is not supported: set fsdp_version: 2 (configs/fsdp.yaml)")
    if args.beta > 0 and is_sharded(accelerator):
        raise SystemExit("error: --beta > 0 needs a full reference model on every rank: use DDP, not FSDP or ZeRO-3")
    if args.overlap and args.backend == "hf" and is_sharded(accelerator) and accelerator.num_processes > 1:
        raise SystemExit("error: --overlap with --backend hf needs DDP: under FSDP or ZeRO-3 the ranks generate "
                         "in lockstep, and overlapped rollouts make as many generate calls as their kernels' timing "
                         "decides")
    return accelerator


def offloads_optimizer(accelerator: Accelerator) -> bool:
    """DeepSpeed ZeRO with the optimizer state in CPU memory (configs/deepspeed_zero3.yaml)."""
    plugin = accelerator.state.deepspeed_plugin
    zero = plugin.deepspeed_config.get("zero_optimization", {}) if plugin is not None else {}
    return zero.get("offload_optimizer", {}).get("device") == "cpu"


def load_policy(args, accelerator: Accelerator, model_path: str):
    """(model, optimizer), prepared by accelerate: the whole model or its LoRA adapters, in training mode.

    fp32 weights under bf16 autocast, but under ZeRO-3 with bf16: there the weights are bf16 and the fp32 master
    copy is the optimizer's (in CPU memory with offload), and the model is loaded into its shards (zero.Init,
    on by zero3_init_flag) in bf16, so no fp32 copy of it is ever made on the host. Unsharded, it is loaded
    straight onto this rank's device (LoRA adapters are then made there): a model loaded on the host and moved a
    tensor at a time took a 7B model's host memory to 43 GiB, and 0.14 GiB more of the GPU's (the allocator's
    rounding of the copies) than the same weights loaded in place."""
    plugin = accelerator.state.deepspeed_plugin
    zero3_bf16 = plugin is not None and plugin.zero_stage == 3 and args.bf16
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.bfloat16 if zero3_bf16 else torch.float32,
                                                 device_map=None if is_sharded(accelerator) else accelerator.device)
    model = put_logprob_head(model, args.logprob_chunk)
    if args.gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if args.lora_rank:
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model, LoraConfig(r=args.lora_rank, lora_alpha=2 * args.lora_rank,
                                                 target_modules="all-linear", task_type="CAUSAL_LM"))
    # AdamW's state is made at the first optimizer step, not here: nothing but the weights is resident before.
    trainable = [p for p in model.parameters() if p.requires_grad]
    if offloads_optimizer(accelerator):  # ZeRO-Offload takes DeepSpeed's own CPU Adam (built at first use) only
        from deepspeed.ops.adam import DeepSpeedCPUAdam

        optimizer = DeepSpeedCPUAdam(trainable, lr=args.lr, weight_decay=args.weight_decay, adamw_mode=True)
    else:  # fused: the default (foreach) step makes a temporary the size of the weights, 1.8 GiB of a 0.5B model
        optimizer = torch.optim.AdamW(trainable, lr=args.lr, weight_decay=args.weight_decay, fused=True)
    if accelerator.state.deepspeed_plugin is not None:  # no dataloader to read the micro-batch size from
        accelerator.state.deepspeed_plugin.deepspeed_config["train_micro_batch_size_per_gpu"] = args.micro_batch_size
    model, optimizer = accelerator.prepare(model, optimizer)
    model.train()
    return model, optimizer


def first_process() -> bool:
    """Whether this is the launch's first process (or there is no launch): the one that speaks for all. Read from
    the launcher's environment, so that it holds before the processes have met."""
    return os.environ.get("RANK", "0") == "0"


def end_after_the_first(status: int, grace_s: float = 10.0) -> None:
    """End, silently and with `status`, a process of a launch stopped by bad input that the first process meets too
    and reports: when the launcher stops it, on seeing the first one end, or at most after `grace_s`. Ending at once
    could have the launcher stop the first process before it has said why."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(status))
    time.sleep(grace_s)
    sys.exit(status)


def lock_output_dir(output_dir: Path) -> None:
    """The output folder, made if need be, locked (advisory, as evaluate.py's -o output) until this process ends:
    a second run on it would log every step twice and save its checkpoints over the first's. The descriptor is
    left open on purpose (close-on-exec: no compiler or fork-server child inherits it)."""
    try:
        output_dir.mkdir(parents=True, exist_ok=True)
        held = os.open(output_dir, os.O_RDONLY)
    except OSError as e:
        raise SystemExit(f"error: cannot write --out {output_dir}: {e.strerror}") from None
    try:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(held)
        raise SystemExit(f"error: --out {output_dir} is in use by another train.py run; wait for it to end "
                         "or pass another --out") from None


def previous_run(output_dir: Path, log_path: Path) -> list[Path]:
    """What an earlier run left: its checkpoints, final model and metrics log."""
    return [path for path in (output_dir / "checkpoints", output_dir / "final", log_path) if path.exists()]


def clear_previous_run(output_dir: Path, log_path: Path) -> None:
    """--overwrite: the previous run's checkpoints, final model and metrics log deleted."""
    for path in previous_run(output_dir, log_path):
        if path.is_dir():
            shutil.rmtree(path)
        else:
            path.unlink()


def logged_steps(log_path: Path) -> int:
    """The last step in the metrics log (0 without one)."""
    lines = log_path.read_text().splitlines() if log_path.exists() else []
    return max((json.loads(line)["step"] for line in lines if line.strip()), default=0)


def checkpoint_step(checkpoint: Path) -> int:
    """The steps done at a checkpoint, from its name."""
    return int(checkpoint.name.removeprefix("step_"))


def resume_checkpoint(output_dir: Path, log_path: Path) -> Path | None:
    """The latest whole checkpoint (its trainer_state.json, written last, there) that the metrics log reaches (any,
    without a log): where the two agree. One cut short by a stop while saving is passed over."""
    found = sorted(state.parent for state in (output_dir / "checkpoints").glob("step_*/trainer_state.json"))
    if log_path.exists():
        logged = logged_steps(log_path)
        found = [path for path in found if checkpoint_step(path) <= logged]
    return found[-1] if found else None


def parameter_checksum(model) -> float:
    """Sum of squares of this rank's parameters, in float64: equal on every rank when DDP kept them in sync.
    Taken 16M values at a time: a float64 copy of a whole 7B model's embedding would be 4.4 GB of GPU memory."""
    with torch.no_grad():
        return float(sum(part.double().square().sum() for p in model.parameters()
                         for part in p.detach().flatten().split(2**24)))


def gpu_gib(tensors) -> float:
    """GiB of GPU memory that these tensors hold, each storage once (tied weights); None and non-tensors are
    skipped, and a ZeRO-3 parameter counts as its partition (ds_tensor)."""
    storages = {}
    for tensor in tensors:
        for held in (tensor, getattr(tensor, "ds_tensor", None)):
            if isinstance(held, torch.Tensor) and held.is_cuda:
                storages[held.untyped_storage().data_ptr()] = held.untyped_storage().nbytes()
    return sum(storages.values()) / 2**30


class UpdateMemory:
    """What this rank's GPU holds during an update: the peak, split into weights, gradients, optimizer state and the
    rest (activations and logits); nothing on the CPU. Made as the update starts, told when the gradients are whole,
    read as it ends."""

    def __init__(self, device: torch.device):
        self.on_gpu, self.gradients = device.type == "cuda", 0.0
        if self.on_gpu:
            torch.cuda.reset_peak_memory_stats()
            self.before = torch.cuda.memory_allocated() / 2**30

    def gradients_done(self, model) -> None:
        """Before the optimizer step: the one moment the gradients are all resident."""
        if self.on_gpu:
            self.gradients = gpu_gib(p.grad for p in model.parameters())

    def report(self, model, optimizer) -> dict[str, float]:
        """The memory/* metrics of the update (none on the CPU)."""
        if not self.on_gpu:
            return {}
        weights = gpu_gib(model.parameters())
        state = gpu_gib(t for per_parameter in optimizer.state.values() for t in per_parameter.values())
        peak = torch.cuda.max_memory_allocated() / 2**30
        return {"memory/before_update_gib": self.before, "memory/peak_gib": peak, "memory/weights_gib": weights,
                "memory/gradients_gib": self.gradients, "memory/optimizer_gib": state,
                "memory/activations_gib": peak - weights - self.gradients - state}


def memory_line(memory: dict[str, float]) -> str:
    """What the first step's update held on the GPU: nothing but the weights is resident before it."""
    return (f"memory of the first update (GiB, this GPU): {memory['memory/before_update_gib']:.2f} before it; "
            f"peak {memory['memory/peak_gib']:.2f} = weights {memory['memory/weights_gib']:.2f} + gradients "
            f"{memory['memory/gradients_gib']:.2f} + optimizer {memory['memory/optimizer_gib']:.2f} + activations "
            f"and logits {memory['memory/activations_gib']:.2f}")

