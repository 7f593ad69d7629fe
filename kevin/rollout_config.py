"""The rollout settings that generate.py and train.py share, declared once: each stage's config subclasses this one.

A stage that needs another default for a shared setting declares the field again in its subclass with that
default; without a docstring under it, the flag's help stays the one here (kevin/config_flags.py). The defaults
here are the paper's (Kevin, arXiv 2507.11948).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from kevin.config_flags import AT_LEAST_1, NOT_NEGATIVE, check
from kevin.evaluator import EvalConfig

ROOT = Path(__file__).resolve().parent.parent


@dataclass
class RolloutConfig:
    model: str = "tiny"
    """HF id or local path of the model (in training, the policy); 'tiny' builds the local tiny model"""
    tasks: str = str(ROOT / "tasks")
    """a task file, a folder of tasks (e.g. a KernelBench level), or a split name of tasks/split.json"""
    split: str | None = None
    """keep only the tasks of this split of tasks/split.json"""
    n_trajectories: int = 16
    """parallel trajectories per task"""
    turns: int = 4
    """refinement turns per trajectory (paper: 4 train, 8 eval)"""
    temperature: float = 0.9
    """sampling temperature (in training, the loss's log-probs use it too)"""
    max_tokens: int = 16384
    """most tokens in one reply"""
    context_budget: int = 16384
    """most prompt tokens; previous attempts that do not fit are dropped earliest first"""
    seed: int = 0
    """seed of sampling (in training, also of task picking and initialisation)"""
    rules: Literal["kevin", "kernelbench"] = "kevin"
    """which rules judge the kernels, and so what the prompt allows: kevin (the paper's: no PyTorch ops or torch.nn
    layers) or kernelbench (KernelBench's: PyTorch allowed for what is not replaced)"""
    overlap: bool = False
    """generate each trajectory's next turn as soon as its own kernel is judged, while the others still build and
    run, instead of once every kernel of the turn is judged; the same records (docs/generation.md)"""
    ray: str | None = EvalConfig.ray
    """address of a Ray cluster (host:port, or 'auto') whose nodes evaluate the kernels, one evaluator per GPU of
    every node, instead of this machine alone (docs/cluster.md)"""
    gpu_memory_utilization: float = 0.9
    """vllm: share of GPU memory the engine takes (on a CPU build: of host memory; lower it there)"""

    def __post_init__(self):
        """A count of 0 would roll out nothing; a temperature of 0 is greedy, and replies are sampled."""
        check(self, {"n_trajectories": AT_LEAST_1, "turns": AT_LEAST_1, "max_tokens": AT_LEAST_1,
                     "context_budget": AT_LEAST_1,
                     "temperature": ("be positive (replies are sampled; the paper's is 0.9)", lambda t: t > 0)})


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
