"""The evaluator's children: what each kind starts with, and what their output comes down to.

Run and build children run candidate code, boxed in by sandbox.py (the mechanisms chosen once a process),
and load extensions from the build cache; compile children run the compiler only. What a child leaves (a
compiler's output, a traceback, an error) is cut down to the lines the model can act on.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys

from kevin import sandbox
from kevin.build_cache import load_from_cache
from kevin.isolation import ChildSettings


_SANDBOX_LINE_SHOWN = []  # the sandbox line is printed once a process, not once an evaluate() call


def sandbox_mechanisms(mode: str) -> dict[str, bool]:
    """The sandbox mechanisms children apply under `--sandbox mode` (off, auto or strict, as EvalConfig checks);
    says which at the first call."""
    mechanisms = sandbox.available() if mode != "off" else {}
    missing = [m for m in sandbox.MECHANISMS if not mechanisms.get(m)]
    if mode == "strict" and missing:
        raise SystemExit(f"error: --sandbox strict, but this kernel lacks {', '.join(missing)}")
    if not _SANDBOX_LINE_SHOWN:
        print(sandbox.describe(mechanisms), file=sys.stderr)
        _SANDBOX_LINE_SHOWN.append(True)
    if any(mechanisms.values()):
        sandbox.make_undumpable()
    return mechanisms


def child_settings(kind: str, readable: list[str], mechanisms: dict) -> dict[str, ChildSettings]:
    """Settings of the run, judge, build and compile children. Where the GPUs' architectures are known, builds
    see no GPU: nvcc needs none, and torch then builds for those architectures instead of probing a device. Run
    and build children run candidate code and load its extensions from the cache; compile children run none,
    nor does the judge, which is boxed in as far as its job allows: it may signal outside its box (it stops and
    kills its runner) and start processes (torch.compile's workers, for --compile-baseline)."""
    env = {}
    if kind == "cuda":
        arch = os.environ.get("TORCH_CUDA_ARCH_LIST") or cuda_arch_list()
        if arch:
            env["TORCH_CUDA_ARCH_LIST"] = arch
    build_env = dict(env, CUDA_VISIBLE_DEVICES="") if "TORCH_CUDA_ARCH_LIST" in env else env
    boxed = dict(readable=tuple(readable), mechanisms=mechanisms)
    return {"run": ChildSettings(env, setup=load_from_cache, runs_candidate=True, **boxed),
            "judge": ChildSettings(env, limit_files=False, scoped=False, **boxed),
            "build": ChildSettings(build_env, setup=load_from_cache, nice=True, runs_candidate=True, **boxed),
            "compile": ChildSettings(build_env, nice=True, **boxed)}


def cuda_arch_list() -> str | None:
    """Compute capability of the visible GPUs, read without touching CUDA in this process."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=compute_cap", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30).stdout.split()
    except (OSError, subprocess.SubprocessError):
        return None
    return ";".join(sorted(set(out))) or None


def trim_compiler_output(text: str, build_root: str, max_lines: int = 30) -> str:
    """The compiler's own error lines with a little context; no ninja command lines, no build paths."""
    text = re.sub(r"^.*?Error building extension '[^']*':", "", text.replace(build_root, "<build>"))
    text = re.sub(r"<build>/[0-9a-f]{20}/", "", text)
    lines = [ln for ln in text.splitlines() if ln.strip() and not ln.startswith(("[", "FAILED:", "ninja:"))
             and not re.match(r"^\s*(/\S*)?(c\+\+|g\+\+|gcc|nvcc|clang\+\+)\s", ln)]
    keep = set()
    for i, line in enumerate(lines):
        if re.search(r"\berror\b|Error", line):
            keep.update(range(i, min(i + 3, len(lines))))
    picked = [lines[i] for i in sorted(keep)] or lines[-max_lines:]
    if len(picked) > max_lines:
        picked = picked[:max_lines] + [f"... ({len(picked) - max_lines} more lines)"]
    return "\n".join(picked)[:4000]


def last_frames(tb: str, candidate_path: str, limit: int = 6) -> str:
    """The traceback lines that point into the candidate's own code, which the model can act on."""
    lines = tb.splitlines()
    keep = []
    for i, line in enumerate(lines):
        if candidate_path in line:
            keep.append(line.replace(candidate_path, "solution.py").strip())
            if i + 1 < len(lines):  # the source line itself
                keep.append(lines[i + 1].strip())
    return "\n".join(keep[-limit:])


def first_lines(message: str, n: int = 4) -> str:
    lines = [ln for ln in message.splitlines() if ln.strip()]
    lines = [ln for ln in lines if "CUDA_LAUNCH_BLOCKING" not in ln and "TORCH_USE_CUDA_DSA" not in ln
             and "asynchronously reported" not in ln and not ln.startswith("Search for")]
    return "\n".join(lines[:n])[:1500]
