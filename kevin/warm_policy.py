"""warm_start.py's config, and the warm-started small policy that train.py and the benches start from
(`policy`): looked up by the settings that make it, shipped for the CPU, else made once by warm_start.py in a
process of its own and cached."""
from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import torch

from kevin.config_flags import AT_LEAST_1, NOT_NEGATIVE, POSITIVE, check, one_of


REPO = Path(__file__).resolve().parents[1]
LIBRARY = REPO / "solutions" / "warm_start"
DEFAULT_TASKS = {"cuda": LIBRARY / "tasks", "cpu": REPO / "tests" / "tasks"}
# Tasks held out of the warm start (no variant names them): other shapes of the library's operators, whose prompts
# the policy has never seen; bench/kevin_table.py evaluates on them.
HELDOUT_TASKS = {"cuda": LIBRARY / "heldout" / "cuda", "cpu": LIBRARY / "heldout" / "cpu"}
CHECKPOINT = "checkpoint.pt"  # in --out until the run is done: what a re-run with the same --out goes on from
# The small policy that `python train.py` starts from (policy()): 2 layers x 128 (~3 MB in fp32) memorise the
# library in 40 epochs; 680 steps, ~12 minutes on two CPU cores, so the CPU's is shipped in SHIPPED/cpu.
POLICY_SETTINGS = {"layers": 2, "hidden": 128, "epochs": 40, "lr": 3e-3, "turns": 4, "paths": 8, "batch_size": 4,
                   "seed": 0}
SHIPPED = LIBRARY / "policy"
CACHE = REPO / ".cache" / "warm_start"


# ---------------------------------------------------------------- config
@dataclass(kw_only=True)
class WarmStartConfig:
    """A run's settings, each field a flag of its name (kevin/config_flags.py): one place for a default and its help.
    Keyword-only, so that --out, which has no default, stays last."""
    # library and tasks
    device: Literal["cuda", "cpu"] | None = None
    """kind of kernels: cuda (CUDA, evaluated on a GPU) or cpu (C++ on the CPU); default: cuda with a GPU, cpu
    without"""
    library: Path | None = None
    """folder of variants (default: solutions/warm_start/<device>)"""
    tasks: Path | None = None
    """task folder the variants' task ids resolve against (default: solutions/warm_start/tasks for cuda, tests/tasks
    for cpu)"""
    turns: int = 4
    """longest rollout to prepare for: histories of up to turns-1 attempts (1: turn-1 examples only, and the library
    is not evaluated)"""
    paths: int = 8
    """sampled attempt paths per task that later-turn prompts come from"""
    near_misses: int = 0
    """near misses (one line dropped) of each correct variant, judged by the evaluator; those judged wrong are
    first attempts, with their real feedback, of examples whose next reply is the variant they came from (0: none)"""
    # model
    model: str = "tiny"
    """'tiny': a fresh model of --layers x --hidden on the tiny tokenizer; else an HF path to fine-tune"""
    layers: int = 4
    """tiny: transformer layers"""
    hidden: int = 256
    """tiny: hidden size (a multiple of 64; heads of 64)"""
    # optimisation
    epochs: int = 60
    """passes over the examples"""
    batch_size: int = 4
    """examples per gradient step"""
    lr: float = 3e-3
    """peak learning rate (AdamW), warm-up 5%, cosine to 10%"""
    seed: int = 0
    """seed of the model, the histories and the shuffling"""
    save_every: int = 200
    """steps between checkpoints (--out/checkpoint.pt; also after the last step and on a Ctrl-C), which a re-run with
    the same --out resumes from"""
    # check
    check_samples: int = 16
    """replies sampled per check prompt (the turn-1 prompt and one later-turn prompt per turn, per task); 0: greedy
    check only"""
    temperature: float = 0.9
    """sampling temperature of the check (train.py's)"""
    # output
    out: str
    """output folder: model, tokenizer, library_evals.jsonl, warm_start.json; while the run is under way, the
    checkpoint.pt a re-run with the same --out resumes from"""

    def __post_init__(self):
        """The defaults that hang on the device resolved, then every value checked, here once: whatever builds a
        config gets a complete one or the first bad value as a ValueError."""
        self.device = self.device or ("cuda" if torch.cuda.is_available() else "cpu")
        check(self, {"device": one_of(*DEFAULT_TASKS)})
        self.library = Path(self.library or LIBRARY / self.device)
        self.tasks = Path(self.tasks or DEFAULT_TASKS[self.device])
        check(self, {**dict.fromkeys(("turns", "paths", "layers", "epochs", "batch_size", "save_every"), AT_LEAST_1),
                     "near_misses": NOT_NEGATIVE,
                     "hidden": ("be a multiple of 64 (heads of 64)", lambda hidden: hidden >= 64 and hidden % 64 == 0),
                     "lr": POSITIVE, "temperature": POSITIVE, "check_samples": NOT_NEGATIVE,
                     **dict.fromkeys(("library", "tasks"), ("be a folder", Path.is_dir))})


def training_flags(args: WarmStartConfig) -> dict:
    """The flags that decide what is trained: a checkpoint is resumed only by a run with the same ones."""
    return {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()
            if k not in ("out", "save_every", "check_samples", "temperature")}


def shown(path: Path) -> str:
    """A folder as a report names it: relative to the repository where it lies inside, so that no report names a
    folder of the machine that made it."""
    path = Path(path).resolve()
    return str(path.relative_to(REPO)) if path.is_relative_to(REPO) else str(path)


# ---------------------------------------------------------------- the policy other stages start from
def policy_key(config: WarmStartConfig) -> str:
    """What decides the policy, as a folder name: the device, the size, and a hash of the training flags (the folders
    left out) and of the bytes of every library and task file, so that an edited variant or task makes a new one."""
    digest = hashlib.sha256(json.dumps({k: v for k, v in training_flags(config).items()
                                        if k not in ("library", "tasks")}, sort_keys=True).encode())
    for folder in (config.library, config.tasks):
        for path in sorted(folder.rglob("*.py")):
            digest.update(str(path.relative_to(folder)).encode() + b"\0" + path.read_bytes())
    return f"{config.device}-{config.layers}x{config.hidden}-{digest.hexdigest()[:12]}"


def is_policy(folder: Path, key: str) -> bool:
    """A finished warm start made with these settings: its policy.json names the key."""
    marker = folder / "policy.json"
    return marker.exists() and json.loads(marker.read_text()).get("key") == key and (folder / "config.json").exists()


def policy(device: str | None = None, **settings) -> Path:
    """The warm-started small policy that `python train.py` trains by default: a folder with the model, its tokenizer
    and warm_start.json. POLICY_SETTINGS, each overridable by a WarmStartConfig field in `settings`, decide it;
    looked up by their key (policy_key) in .cache/warm_start/<key>, then in the shipped solutions/warm_start/policy/
    <device>, else made once here by warm_start.py (no sampling check) and cached. Processes that ask at once
    (ranks of one launch) wait on a lock for the one that makes it."""
    config = WarmStartConfig(device=device, out="", check_samples=0, **{**POLICY_SETTINGS, **settings})
    key = policy_key(config)
    cached = CACHE / key
    if is_policy(SHIPPED / config.device, key):
        return SHIPPED / config.device
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(CACHE / f"{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not is_policy(cached, key):
            make_policy(config, key, cached)
    return cached


def make_policy(config: WarmStartConfig, key: str, folder: Path) -> None:
    """warm_start.py into `folder` with `config`'s flags, in a process of its own (its Accelerator must not join a
    launch's process group), written beside it and renamed into place once whole; policy.json marks it done."""
    partial = folder.with_name(folder.name + ".partial")  # an interrupted one resumes from its checkpoint
    flags = [f"--{k.replace('_', '-')}={v}" for k, v in vars(config).items() if k not in ("out", "check_samples")]
    print(f"warm start: making the policy {key} once ({shown(folder)}; later runs reuse it)", file=sys.stderr)
    launch = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
    env = {k: v for k, v in os.environ.items() if k not in launch and not k.startswith("ACCELERATE_")}
    started_at = time.perf_counter()
    done = subprocess.run([sys.executable, str(REPO / "warm_start.py"), *flags, "--check-samples", "0",
                           "--out", str(partial)], env=env)
    if done.returncode:
        raise SystemExit(f"error: the warm start failed (exit status {done.returncode}); its output is above")
    (partial / "policy.json").write_text(json.dumps({"key": key, "settings": training_flags(config) | {
        "library": shown(config.library), "tasks": shown(config.tasks)}, "seconds": round(
            time.perf_counter() - started_at, 1)}, indent=1))
    shutil.rmtree(folder, ignore_errors=True)
    partial.replace(folder)
