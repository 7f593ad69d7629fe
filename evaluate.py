"""Compile, check and time candidate kernels against a task's PyTorch reference.

A candidate is a Python module defining `ModelNew` whose work is done by native code it builds with
`torch.utils.cpp_extension.load_inline` (CUDA on a GPU; C++ with `--device cpu`, so the whole pipeline
also runs where no GPU exists). Each candidate gets a status, a speedup and the feedback text the model
reads on its next turn (the five kinds of the Kevin paper, plus `rejected` and `timeout`).

Pipeline, per call of `evaluate(records)`:
  1. parse: the last fenced code block of a reply (or the record's code as is); the paper's static rules
     (no try/except, no `pass`, no torch.nn layers / functional / torch compute ops, a native kernel).
  2. build: every distinct candidate is imported in a child process from a pool sized to the cores;
     `load_inline` is redirected to a build folder named by the hash of its arguments, so an extension
     that appears in many candidates (a GRPO group, a later turn) is compiled once and reused; its CUDA
     file is compiled against a light torch/types.h and its main.cpp against a precompiled
     torch/extension.h, each with a fallback to the build as written (`_fast_load_inline`).
  3. run: per GPU, one fresh child process per candidate, set up (CUDA context and all) while the ones
     before it run: correctness on `--correct-trials` fresh random input sets (candidate first, then the
     reference, each on its own clone of the inputs; shape, dtype, NaN/Inf and tolerance checks), then
     candidate and reference timed alternately in the same process (warm-up, L2 flush before each trial,
     CUDA events closed after a device-wide synchronize, median).
  A crash, illegal memory access, `sys.exit` or hang kills only that child; the result says so.

Defaults follow the KernelBench version Kevin used (atol = rtol = 1e-2, seed 42 before building each
model so parameters made the same way match); where the paper is silent (number of correctness inputs,
timing protocol) the choices are flags documented in the README.

Usage:
  python evaluate.py IN.jsonl > OUT.jsonl        # records with `task` and `code`; `-` reads stdin
  python evaluate.py IN.jsonl -o OUT.jsonl       # appends as results finish; a re-run resumes
  python evaluate.py                              # the hand-written kernels in solutions/, GPU if any
"""
from __future__ import annotations

import argparse
import ast
import collections
import contextlib
import fcntl
import hashlib
import inspect
import itertools
import json
import math
import multiprocessing as mp
import os
import queue
import random
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent
STATUSES = ("format_error", "rejected", "compile_error", "runtime_error", "timeout", "incorrect", "correct")


@dataclass
class EvalConfig:
    device: str = "auto"
    """'cuda' (CUDA candidates, one worker per GPU), 'cpu' (C++ candidates) or 'auto' (cuda if visible)"""
    gpus: list[int] | None = None
    """GPU indices to spread candidates over; None = every visible GPU"""
    tasks: str = str(ROOT / "tasks")
    """task folder (or KernelBench level folder) that task ids are resolved against"""
    correct_trials: int = 5
    """fresh random input sets the candidate must match the reference on"""
    atol: float = 1e-2
    """absolute tolerance (KernelBench as used by Kevin: 1e-2)"""
    rtol: float = 1e-2
    """relative tolerance"""
    timing_trials: int = 100
    """timed runs per model (fewer if --timing-budget-s runs out first, never fewer than 10)"""
    timing_budget_s: float = 10.0
    """wall-clock budget for the timed runs of one candidate and its reference together"""
    warmup: int = 3
    """untimed runs per model before timing"""
    compile_baseline: bool = False
    """also time torch.compile(Model) and report speedup_vs_compile"""
    min_own_kernel_share: float = 0.8
    """least share of the forward's GPU time (fills and copies aside) in the candidate's own __global__
    kernels, profiled; 0 turns the check off"""
    poison_bytes: int = 2 << 30
    """free device memory filled with NaN before each correctness run (at most half of what is free)"""
    defences: bool = True
    """False skips every runtime defence (poison, clones, second run, probes, profiler, fresh timing inputs,
    spot checks, tamper checks): only to measure what they cost (bench/defence_cost.py)"""
    seed: int = 42
    """seed set before get_init_inputs and before building each model (KernelBench's convention)"""
    compile_workers: int = len(os.sched_getaffinity(0))
    """candidates built at once"""
    spare_children: int = 3
    """checking children started ahead on each GPU, no more than there are candidates left: each sets itself up
    (CUDA context, torch._dynamo: seconds) while the candidates before it run (about a second each once built)"""
    compile_timeout_s: float = 900.0
    """wall-clock limit for building one candidate"""
    run_timeout_s: float = 180.0
    """wall-clock limit for checking and timing one candidate (KernelBench's batch scripts: 180 s)"""
    build_dir: str = str(ROOT / ".cache" / "builds")
    """where extensions are built, one folder per distinct extension (kept: a cache across runs)"""
    progress: bool = True
    """show a tqdm bar"""


# ----------------------------------------------------------------------------------------------------
# Tasks

def load_tasks(path: str | Path) -> dict[str, Path]:
    """Task id -> file for a task file, a folder of them, or a KernelBench level folder, unchanged.

    Ids are `<parent folder>/<file stem>` (e.g. `level1/19_ReLU`), stable wherever the folder lives."""
    path = Path(path)
    if path.is_file():
        files = [path]
    elif path.is_dir():
        files = sorted(p for p in path.rglob("*.py") if not p.name.startswith(("_", ".")))
    else:
        raise SystemExit(f"error: no task file or folder at {path}")
    tasks = {}
    for f in files:
        text = f.read_text(errors="replace")
        if "class Model" in text and "def get_inputs" in text:
            tasks[f"{f.parent.name}/{f.stem}"] = f.resolve()
    return tasks


def resolve_task(task: str, index: dict[str, Path]) -> Path:
    if task in index:
        return index[task]
    if Path(task).is_file():
        return Path(task).resolve()
    raise ValueError(f"unknown task {task!r}: neither a task id under the task folder nor a file")


# ----------------------------------------------------------------------------------------------------
# Parsing and the static rules

FENCE = re.compile(r"```[ \t]*([\w+-]*)[^\n]*\n(.*?)```", re.DOTALL)


def extract_code(reply: str) -> str | None:
    """The candidate in a reply: its last fenced Python (or untagged) block, else its last block.

    A text without any fence that mentions ModelNew is taken as source code as it is."""
    blocks = FENCE.findall(reply)
    if not blocks:
        return reply if "```" not in reply and "ModelNew" in reply else None
    python = [body for lang, body in blocks if lang.lower() in ("", "python", "py", "python3")]
    return (python or [blocks[-1][1]])[-1]


# torch.nn names a solution may use: the module system, parameters, containers and init.
ALLOWED_NN = {"Module", "Parameter", "ParameterList", "ParameterDict", "ModuleList", "ModuleDict",
              "Sequential", "init", "Buffer"}
# torch.* calls a solution may make: allocation, random init, dtypes/devices and the extension builder.
ALLOWED_TORCH_CALLS = {
    "empty", "empty_like", "empty_strided", "zeros", "zeros_like", "ones", "ones_like", "full", "full_like",
    "rand", "randn", "randint", "rand_like", "randn_like", "randint_like", "randperm", "arange", "tensor",
    "as_tensor", "from_numpy", "manual_seed", "device", "dtype", "Size", "Tensor", "no_grad",
    "inference_mode", "is_tensor", "get_default_dtype", "set_grad_enabled", "is_grad_enabled",
    "is_floating_point",
}
ALLOWED_TORCH_NAMESPACES = ("torch.cuda", "torch.utils.cpp_extension", "torch.nn.init", "torch.backends")
# module -> the rule that bans it: work outside the timed region, or reaching into the checker's memory.
BANNED_IMPORTS = {"threading": "threads", "multiprocessing": "threads", "concurrent": "threads",
                  "asyncio": "threads", "subprocess": "threads", "ctypes": "introspection",
                  "gc": "introspection", "inspect": "introspection", "builtins": "introspection",
                  "importlib": "introspection"}
# Attributes that reach frames, globals or other objects' code: the evaluator's locals are one hop away.
INTROSPECTION = {"_getframe", "f_back", "f_locals", "f_globals", "f_code", "tb_frame", "gi_frame", "cr_frame",
                 "__globals__", "__builtins__", "__closure__", "__code__", "__import__"}


NATIVE_THREADS = re.compile(r"std::thread|std::async|std::jthread|pthread_create|cudaLaunchHostFunc|"
                            r"cudaStreamAddCallback")
GLOBAL_FUNCTION = re.compile(r"__global__\s+[\w:<>,\s*&]*?\b(\w+)\s*\(")


def kernel_names(code: str) -> list[str]:
    """Names of the __global__ functions a candidate defines: its own kernels, as the profiler names them."""
    return sorted(set(GLOBAL_FUNCTION.findall(re.sub(r"__launch_bounds__\s*\([^)]*\)", "", code))))


def _dotted(node: ast.AST, aliases: dict[str, str]) -> str | None:
    """`nn.functional.relu` -> `torch.nn.functional.relu`, through the module's import aliases."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name) or node.id not in aliases:
        return None
    return ".".join([aliases[node.id], *reversed(parts)])


def static_check(code: str, device: str) -> tuple[str, str] | None:
    """(status, feedback) if the source breaks a rule, else None. Cheap: no import, no build."""
    try:
        tree = ast.parse(code)
    except SyntaxError as e:
        return "compile_error", f"Python syntax error on line {e.lineno}: {e.msg}"
    classes = {n.name: n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)}
    if "ModelNew" not in classes:
        return "format_error", "The code defines no `class ModelNew(torch.nn.Module)`."
    aliases: dict[str, str] = {"torch": "torch"}
    violations: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                aliases[(a.asname or a.name).split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
                if a.name.startswith("torch.nn.functional"):
                    violations.append("[torch-functional] imports torch.nn.functional")
                if a.name.split(".")[0] in BANNED_IMPORTS:
                    violations.append(f"[{BANNED_IMPORTS[a.name.split('.')[0]]}] line {node.lineno}: "
                                      f"importing {a.name} is not allowed")
        elif isinstance(node, ast.ImportFrom) and node.module:
            for a in node.names:
                aliases[a.asname or a.name] = f"{node.module}.{a.name}"
            if node.module.startswith("torch.nn.functional") or (
                    node.module == "torch.nn" and any(a.name == "functional" for a in node.names)):
                violations.append("[torch-functional] imports torch.nn.functional")
            if node.module.split(".")[0] in BANNED_IMPORTS:
                violations.append(f"[{BANNED_IMPORTS[node.module.split('.')[0]]}] line {node.lineno}: "
                                  f"importing {node.module} is not allowed")
    for node in ast.walk(tree):
        if isinstance(node, (ast.Try, getattr(ast, "TryStar", ast.Try))):
            violations.append(f"[try-except] line {node.lineno}: try/except is not allowed (no fallback paths)")
        elif isinstance(node, ast.Pass):
            violations.append(f"[pass] line {node.lineno}: `pass` is not allowed")
        elif isinstance(node, (ast.Attribute, ast.Name)):
            if (node.attr if isinstance(node, ast.Attribute) else node.id) in INTROSPECTION:
                violations.append(f"[introspection] line {node.lineno}: "
                                  f"{node.attr if isinstance(node, ast.Attribute) else node.id} is not allowed")
            name = _dotted(node, aliases)
            if name and isinstance(node, ast.Attribute) and node.attr in BANNED_IMPORTS:  # torch.cuda.threading
                violations.append(f"[{BANNED_IMPORTS[node.attr]}] line {node.lineno}: {name} is not allowed")
            if name and name.startswith("torch.nn.") and not name.startswith("torch.nn.init"):
                member = name.split(".")[2]
                if member == "functional":
                    violations.append(f"[torch-functional] line {node.lineno}: {name} is not allowed")
                elif member not in ALLOWED_NN and member[:1].isupper():
                    violations.append(f"[torch-nn-layer] line {node.lineno}: torch.nn.{member} is not allowed "
                                      "(only Module, Parameter, containers and init)")
        if isinstance(node, ast.Call):
            name = _dotted(node.func, aliases)
            if (name and name.startswith("torch.") and not name.startswith(ALLOWED_TORCH_NAMESPACES)
                    and not name.startswith("torch.nn.") and name.split(".")[1] not in ALLOWED_TORCH_CALLS):
                violations.append(f"[torch-op] line {node.lineno}: the PyTorch op {name}() is not allowed: "
                                  "the work must be done by your own kernel")
    bases = {_dotted(b, {**aliases, "Model": "Model"}) or "" for b in classes["ModelNew"].bases}
    if "Model" in bases or any(b.endswith(".Model") for b in bases):
        violations.append("[subclass-reference] ModelNew must not subclass the reference Model")
    if NATIVE_THREADS.search(code):
        violations.append("[threads] native code must not start threads or host callbacks (std::thread, "
                          "pthread_create, std::async, cudaLaunchHostFunc)")
    if "load_inline" not in code:
        violations.append("[no-kernel] no native kernel: build one with torch.utils.cpp_extension.load_inline")
    elif device == "cuda" and not kernel_names(code):
        violations.append("[no-kernel] no CUDA kernel: cuda_sources must define a __global__ kernel")
    if violations:
        unique = list(dict.fromkeys(violations))
        return "rejected", "Rejected by the rules:\n" + "\n".join(f"- {v}" for v in unique[:10])
    return None


# ----------------------------------------------------------------------------------------------------
# Child processes: building and running happen in fresh processes forked from a server that has
# already imported torch, so a crash, a hang or a poisoned CUDA context costs one child, not the run.

_CONTEXT = None


def _mp_context():
    """Children fork from a server process that has imported torch but never touches CUDA, whatever
    the caller has done, so each starts in milliseconds instead of re-importing torch (~5 s on the H200
    machine). Only `torch` is preloaded: once torch.utils.cpp_extension is imported, torch's CUDA build
    refuses CUDA to forked children ("Cannot re-initialize CUDA in forked subprocess")."""
    global _CONTEXT
    if _CONTEXT is None:
        _CONTEXT = mp.get_context("forkserver")
        _CONTEXT.set_forkserver_preload(["torch"])
    return _CONTEXT


_HEAVY_INCLUDE = re.compile(r'^[ \t]*#[ \t]*include[ \t]*[<"]torch/extension\.h[>"]', re.M)
# What a compiler says when a declaration is missing, as a lighter header could cause; other errors (syntax,
# types) come out the same under either header, so the source is not built a second time for them.
_MISSING_NAME = re.compile(r"undefined|no member|not a member|class or namespace|incomplete type|no instance|"
                           r"no suitable|not a template|not declared|no matching|cannot open|identifier|"
                           r"no operator|no storage class", re.I)
# A build is first tried against light stand-ins for torch's two headers, found first on the compilers'
# include paths. torch/types.h, which load_inline puts at the top of every CUDA file: the tensor class and its
# operators, the dispatch macros and the usual factories and ops, with torch:: naming at:: as in the real
# one. AT_PER_OPERATOR_HEADERS (as in torch's own build) keeps the operators' header from including all of
# ATen's ~2,500 ops; the autograd and library headers and pybind11 are left out. nvcc compiles a plain kernel
# file against it in a quarter of the CPU time it takes with torch/extension.h (14 s against 58 s on a
# 2-core machine). torch/extension.h, which starts the generated main.cpp: the light torch/types.h, what
# binding a function to Python takes (pybind11, torch's type casters, torch::wrap_pybind_function) and
# at::parallel_for, not the C++ frontend (torch::nn, optim, data); g++ compiles main.cpp in a third of the
# time (7.5 s against 22 s), or 3.8 s with the light header precompiled.
# A source that names what the light headers lack in a way that may not fail as a missing name (a macro
# such as TORCH_LIBRARY or PYBIND11_MODULE, or requires_grad, which torch::'s factories honour and at::'s
# refuse at run time) is built as written.
_BEYOND_LIGHT = re.compile(r"PYBIND11|pybind11|\bpy::|TORCH_LIBRARY|requires_grad")
_LIGHT_OPS = ("empty", "empty_like", "empty_strided", "zeros", "zeros_like", "ones", "ones_like", "full",
              "full_like", "arange", "rand", "randn", "cat", "stack", "matmul", "mm", "bmm", "addmm", "sum",
              "mean", "amax", "max", "min", "argmax", "exp", "log", "sqrt", "pow", "abs", "clamp", "where",
              "add", "sub", "mul", "div", "softmax", "relu", "tanh", "sigmoid", "transpose", "reshape")
_LIGHT_TYPES_H = "".join(
    ["// evaluate.py's light stand-in for torch/types.h in a build's first attempt\n#pragma once\n",
     "#define AT_PER_OPERATOR_HEADERS\n",
     "#include <ATen/core/Tensor.h>\n#include <ATen/Dispatch.h>\n#include <ATen/TensorOperators.h>\n"]
    + [f"#include <ATen/ops/{op}.h>\n" for op in _LIGHT_OPS]
    + ["#undef AT_PER_OPERATOR_HEADERS\n", "namespace torch {\nusing namespace at;\nusing Dtype = at::ScalarType;\n"]
    + [f"constexpr auto k{alias} = at::k{name};\n" for alias, name in (
        ("UInt8", "Byte"), ("Int8", "Char"), ("Int16", "Short"), ("Int32", "Int"), ("Int64", "Long"),
        ("UInt16", "UInt16"), ("UInt32", "UInt32"), ("UInt64", "UInt64"), ("Float16", "Half"), ("Float32", "Float"),
        ("Float64", "Double"), ("U8", "Byte"), ("U16", "UInt16"), ("U32", "UInt32"), ("U64", "UInt64"), ("I8", "Char"),
        ("I16", "Short"), ("I32", "Int"), ("I64", "Long"), ("F16", "Half"), ("F32", "Float"), ("F64", "Double"))]
    + ["}  // namespace torch\n"])
_LIGHT_EXTENSION_H = ("// evaluate.py's light stand-in for torch/extension.h in a build's first attempt\n#pragma once\n"
                      "#include <torch/types.h>\n#include <ATen/Parallel.h>\n#include <torch/csrc/Exceptions.h>\n")


def _sources(arguments: dict, kind: str) -> list[str]:
    """load_inline's cpp_sources or cuda_sources, which may be one string or a list of them, as a list."""
    sources = arguments.get(kind)
    return [sources] if isinstance(sources, str) else list(sources or [])


class BuildUnderWay(Exception):
    """Raised in a build job whose extension another process is building: the job gives its compile slot
    back and runs again (a load, then) once that build is done, instead of holding the slot while it waits."""


def _content_addressed_load_inline(build_root: str, building: bool):
    """Wrap load_inline so that each distinct extension is built once, in a folder named by its inputs,
    and faster than as written (see `_fast_load_inline`). Copies that differ only in the extension's name,
    as samples of one group and a model's later turns often do, share one build under a name made from
    the rest, unless their sources spell the name out (their own PYBIND11_MODULE, say). In a build job
    (`building`), an extension that another process is building raises BuildUnderWay."""
    import torch
    import torch.utils.cpp_extension as cpp_ext

    original = cpp_ext.load_inline
    signature = inspect.signature(original)

    def load_inline(*args, **kwargs):
        bound = signature.bind(*args, **kwargs)
        if bound.arguments.get("build_directory") is not None:
            return original(*bound.args, **bound.kwargs)
        arguments = dict(bound.arguments)
        written = "\n".join(_sources(arguments, "cpp_sources") + _sources(arguments, "cuda_sources"))
        if not re.search(rf"\b{re.escape(str(arguments['name']))}\b", written):
            del arguments["name"]
        key = repr(sorted((k, v) for k, v in arguments.items() if k != "verbose"))
        key += torch.__version__ + os.environ.get("TORCH_CUDA_ARCH_LIST", "")
        digest = hashlib.sha256(key.encode()).hexdigest()[:20]
        arguments.setdefault("name", f"ext_{digest}")
        folder = Path(build_root) / digest
        folder.mkdir(parents=True, exist_ok=True)
        lock = folder / "lock"  # left behind by a build that was killed: older than any live build
        if lock.exists() and time.time() - lock.stat().st_mtime > float(os.environ["KEVIN_STALE_LOCK_S"]):
            lock.unlink(missing_ok=True)
        arguments["build_directory"] = str(folder)
        to_build = building and not (folder / f"{arguments['name']}.so").exists()
        with _claim(folder) if to_build else contextlib.nullcontext():
            return _fast_load_inline(original, arguments, folder, Path(build_root), make_pch=building)

    cpp_ext.load_inline = load_inline


@contextlib.contextmanager
def _claim(folder: Path):
    """Held by the one build job that builds the extension in `folder` (the lock goes with its process);
    another that finds it held raises BuildUnderWay, and its parent waits in `_wait_for_build`."""
    with open(folder / "claim", "w") as claim:
        try:
            fcntl.flock(claim, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            raise BuildUnderWay(claim.name) from None
        yield


def _wait_for_build(claim: str) -> None:
    """Until the build job that holds an extension's claim is done, or was killed."""
    with open(claim) as f:
        fcntl.flock(f, fcntl.LOCK_EX)


def _fast_load_inline(original, arguments: dict, folder: Path, build_root: Path, make_pch: bool):
    """load_inline past most of torch's headers, which are >95% of a build: its CUDA file and its main.cpp
    are compiled against the light headers (`_LIGHT_TYPES_H`, `_LIGHT_EXTENSION_H`) in a folder first on
    both compilers' include paths, torch/extension.h included by a CUDA source becoming torch/types.h (the
    Python bindings are compiled in main.cpp). If that fails for a missing name, the source as written is
    built (any other error is the same under both); one that names what the light headers lack in other
    ways (`_BEYOND_LIGHT`) is built as written from the start. The folder is one per set of compiler flags:
    the first build precompiles its torch/extension.h there with its own flags, and main.cpp picks that up
    where it exists (gcc ignores one made under other flags, and reads the text instead). Whether a build
    took the light headers is recorded in its folder, so that a later load finds the same build."""
    import torch.utils.cpp_extension as cpp_ext

    cuda = _sources(arguments, "cuda_sources")
    flags_key = repr([arguments.get("extra_cflags"), arguments.get("extra_include_paths"), bool(cuda),
                      arguments.get("with_cuda"), os.environ.get("CXX"), cpp_ext.__file__,
                      _LIGHT_TYPES_H, _LIGHT_EXTENSION_H])
    light = build_root / "light" / hashlib.sha256(flags_key.encode()).hexdigest()[:16]
    record = folder / "shortcuts.json"
    took_light = json.loads(record.read_text()).get("light") if record.exists() else None
    if took_light is None:
        took_light = (not any(_BEYOND_LIGHT.search(s) for s in _sources(arguments, "cpp_sources") + cuda)
                      and not re.search(r"\s", str(light)))
        record.write_text(json.dumps({"light": took_light}))
    if took_light:
        _write_light_headers(light)

    def build():
        kwargs = dict(arguments)
        if took_light:
            kwargs["cuda_sources"] = [_HEAVY_INCLUDE.sub("#include <torch/types.h>", s) for s in cuda]
            kwargs["extra_cflags"] = [f"-I{light}"] + list(arguments.get("extra_cflags") or [])
            kwargs["extra_cuda_cflags"] = [f"-I{light}"] + list(arguments.get("extra_cuda_cflags") or [])
        return original(**kwargs)

    pch = light / "torch" / "extension.h.gch"  # where gcc looks for a precompiled torch/extension.h
    build_done, maker = threading.Event(), None
    if took_light and make_pch and not pch.exists():
        maker = threading.Thread(target=_make_precompiled_header, args=(folder / "build.ninja", pch, build_done))
        maker.start()
    try:
        try:
            return build()
        except Exception as e:  # noqa: BLE001 - maybe the lighter headers: build the source as written
            errors = [line for line in str(e).splitlines() if "error" in line]
            if not took_light or not any(_MISSING_NAME.search(line) for line in errors):
                raise
            took_light = False
            record.write_text(json.dumps({"light": False}))
            # torch renames an extension rebuilt in the same process from other sources (name_v1); forget the
            # failed attempt, so that the build keeps the name a later load in a fresh process looks for
            versioner = getattr(cpp_ext, "JIT_EXTENSION_VERSIONER", None)
            if versioner is not None:
                versioner.entries.pop(arguments["name"], None)
            return build()
    finally:
        build_done.set()
        if maker is not None:
            maker.join()


def _write_light_headers(folder: Path) -> None:
    """The light torch/types.h and torch/extension.h in folder/torch, written once (atomically: other builds
    may be reading them)."""
    for name, text in (("types.h", _LIGHT_TYPES_H), ("extension.h", _LIGHT_EXTENSION_H)):
        target = folder / "torch" / name
        if not target.exists():
            target.parent.mkdir(parents=True, exist_ok=True)
            partial = target.with_name(f"{name}.{os.getpid()}")
            partial.write_text(text)
            partial.rename(target)


def _make_precompiled_header(ninja_file: Path, pch: Path, build_done: threading.Event) -> None:
    """Precompile the light torch/extension.h with the flags ninja uses for this build's main.cpp, as soon as
    load_inline has written its build.ninja; once: the first process to take the lock does it, the others go
    on without. The extension's name is left out: gcc refuses a header made under another value of a macro,
    and torch's headers never read this one."""
    while True:
        done = build_done.is_set()  # read before the file: a build that is done has written all it will
        ninja = ninja_file.read_text() if ninja_file.exists() else ""
        flags, compiler = re.search(r"^cflags = (.*)$", ninja, re.M), re.search(r"^cxx = (.*)$", ninja, re.M)
        if (flags and compiler) or done:
            break
        build_done.wait(0.2)
    if not (flags and compiler):
        return
    with open(pch.parent / "lock", "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return
        if pch.exists():
            return
        partial = pch.with_suffix(".gch.partial")
        own_flags = re.sub(r"-DTORCH_EXTENSION_NAME=\S+", "", flags.group(1))
        command = shlex.split(compiler.group(1)) + shlex.split(own_flags) + \
            ["-x", "c++-header", str(pch.with_suffix("")), "-o", str(partial)]
        if subprocess.run(command, capture_output=True).returncode == 0:
            partial.rename(pch)


def _import_file(path: str, name: str):
    """Execute a source file as a module (a task, or a candidate) without touching sys.modules."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _child_entry(conn, job: str, env: dict, log_path: str, device: str | None):
    """Runs in the child: own process group, output to a log; sets up, waits for its one payload, and sends
    the result (a dict) back through `conn`."""
    os.setpgrp()
    if job == "build":  # compilers yield the cores to a checking child timing a kernel beside them
        os.nice(10)
    import resource

    resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 30, 1 << 30))  # a print loop cannot fill the disk
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.environ.update(env)
    try:
        _content_addressed_load_inline(env["KEVIN_BUILD_ROOT"], building=job == "build")
        if device and device.startswith("cuda"):
            _warm_up(device)
        failed = None
    except BaseException as e:  # noqa: BLE001 - reported as the result of the job it was waiting for
        failed = {"error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()}
    ready_at = time.time()
    payload = conn.recv()
    try:
        result = failed or (_build(payload) if job == "build" else _run(payload))
    except BaseException as e:  # noqa: BLE001 - everything a candidate raises is a result, SystemExit too
        result = {"error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()}
    usage = [resource.getrusage(who) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)]
    result["cpu_s"] = sum(u.ru_utime + u.ru_stime for u in usage)  # compilers included: where the cores go
    result["ready_at"] = ready_at
    sys.stdout.flush()
    sys.stderr.flush()
    conn.send(result)
    conn.close()


def _warm_up(device: str) -> None:
    """What a GPU run needs before its candidate, done while the candidate before it is still running:
    the CUDA context, and torch._dynamo, which torch's profiler loads on first use (seconds together)."""
    import torch
    import torch._dynamo  # noqa: F401

    torch.cuda.set_device(device)
    torch.zeros(1, device=device)


def _build(payload: dict) -> dict:
    start = time.perf_counter()
    try:
        _import_file(payload["candidate"], "candidate")
    except BuildUnderWay as e:
        return {"busy": str(e)}
    return {"seconds": time.perf_counter() - start}


def start_child(job: str, env: dict, log_path: str, device: str | None = None) -> tuple:
    """A fresh child for one `job` ('build' or 'run'), started ahead: it sets itself up while it waits."""
    ctx = _mp_context()
    conn, child_end = ctx.Pipe()
    child = ctx.Process(target=_child_entry, args=(child_end, job, env, log_path, device), daemon=True)
    child.start()
    child_end.close()
    return child, conn, log_path


def finish_child(started: tuple, payload: dict, timeout_s: float) -> dict:
    """Give a started child its payload and wait; {'timeout': True}, {'crash': ...} or the child's own
    result dict."""
    child, conn, log_path = started
    result, timed_out = None, False
    try:
        conn.send(payload)
        if conn.poll(timeout_s):
            result = conn.recv()  # EOFError: the child died without a word
        else:
            timed_out = True
    except (EOFError, OSError):
        result = None
    finally:
        conn.close()
    if result is not None:
        stop_child_later(started)
        return result
    child.join(timeout=0.5)  # dying: its exit code says how
    stop_child(started)
    if timed_out:
        return {"timeout": True}
    return {"crash": _describe_exit(child.exitcode), "log": _tail(log_path)}


def stop_child(started: tuple) -> None:
    """Kill a child and anything it started (ninja, nvcc), e.g. one started ahead and not needed."""
    child = started[0]
    try:
        os.killpg(child.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        child.kill()  # not (yet) the leader of its own process group
    child.join()


def stop_child_later(started: tuple) -> None:
    """stop_child in the background: the exit of a child that is done or not needed (seconds, with a CUDA
    context) is not waited for on the caller's path."""
    threading.Thread(target=stop_child, args=(started,), daemon=True).start()


def run_in_child(job: str, payload: dict, env: dict, timeout_s: float, log_path: str) -> dict:
    """Run `job` in a fresh child; see finish_child."""
    return finish_child(start_child(job, env, log_path), payload, timeout_s)


def _describe_exit(code: int) -> str:
    if code < 0:
        try:
            return f"the process was killed by signal {signal.Signals(-code).name}"
        except ValueError:
            return f"the process was killed by signal {-code}"
    return f"the process exited with code {code}"


def _tail(path: str, limit: int = 4000) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - limit))
            return f.read().decode(errors="replace")
    except OSError:
        return ""


# ----------------------------------------------------------------------------------------------------
# The check and the timing, inside the run child


def _flatten(out) -> list:
    return list(out) if isinstance(out, (tuple, list)) else [out]


def _identical(a, b) -> bool:
    """Bitwise equal, NaN included."""
    import torch

    return torch.equal(a, b) or (a.is_floating_point() and a.shape == b.shape
                                 and torch.allclose(a, b, rtol=0, atol=0, equal_nan=True))


def _compare(candidate, reference, atol: float, rtol: float) -> tuple[str | None, str | None, float]:
    """(status, why, max |difference|) for one trial's outputs; status None when they match.

    What a correct but clumsy kernel gets wrong is `incorrect`; an output that could only pass by
    gaming the check (a tensor subclass, no storage, NaN where the reference is finite) is `rejected`."""
    import torch

    cand, ref = _flatten(candidate), _flatten(reference)
    if len(cand) != len(ref):
        return "incorrect", f"expected {len(ref)} outputs, got {len(cand)}", math.inf
    worst = 0.0
    for i, (c, r) in enumerate(zip(cand, ref)):
        where = f"output {i}: " if len(ref) > 1 else ""
        if not isinstance(r, torch.Tensor):
            r = torch.as_tensor(r, device=c.device if isinstance(c, torch.Tensor) else None)
        if not isinstance(c, torch.Tensor):
            return "incorrect", f"{where}expected a tensor, got {type(c).__name__}", math.inf
        if type(c) is not torch.Tensor or c.layout != torch.strided:
            return "rejected", f"[not-plain-tensor] {where}the output is a {type(c).__name__} ({c.layout}), " \
                               "not a plain dense torch.Tensor", math.inf
        if c.device != r.device:
            return "rejected", f"[not-plain-tensor] {where}the output is on {c.device}, not {r.device}", math.inf
        if c.numel() and c.untyped_storage().data_ptr() == 0:
            return "rejected", f"[not-plain-tensor] {where}the output has no storage", math.inf
        if c.shape != r.shape:
            return "incorrect", f"{where}shape mismatch: expected {tuple(r.shape)}, got {tuple(c.shape)}", math.inf
        if c.dtype != r.dtype:
            return "incorrect", f"{where}dtype mismatch: expected {r.dtype}, got {c.dtype}", math.inf
        c, r = c.detach().double(), r.detach().double()
        bad = ~torch.isfinite(c) & torch.isfinite(r)
        if bad.any():
            return "rejected", f"[nan-output] {where}{int(bad.sum())} NaN/Inf values where the reference is " \
                               "finite (unwritten output memory reads as NaN here)", math.inf
        finite = torch.isfinite(r)
        diff = (c - r).abs()[finite]
        worst = max(worst, float(diff.max()) if diff.numel() else 0.0)
        if not torch.allclose(c, r, atol=atol, rtol=rtol, equal_nan=True):
            n_bad = int((diff > (atol + rtol * r.abs())[finite]).sum())
            return "incorrect", (f"{where}{n_bad} of {r.numel()} values differ beyond atol={atol}, rtol={rtol} "
                                 f"(max abs difference {float(diff.max()):.4g})"), worst
    return None, None, worst


def _trusted_objects() -> dict:
    """Everything the check and the timing call, by identity: a candidate that replaces one is rejected.
    Every method of torch.Tensor, every builtin, torch's and torch.cuda's functions, this module's own."""
    import builtins

    import torch

    owners = {"torch": torch, "torch.cuda": torch.cuda, "torch.cuda.Event": torch.cuda.Event,
              "torch.Tensor": torch.Tensor, "builtins": builtins, "time": time, "evaluate": sys.modules[__name__]}
    return {f"{label}.{name}": value for label, owner in owners.items() for name, value in vars(owner).items()
            if callable(value)}


# Namespaces of library kernels (ATen, CUB, CUTLASS, ...): a candidate's kernel named like one of those
# is still theirs only if it is not in one of these.
LIBRARY_NAMESPACES = {"at", "native", "c10", "cub", "thrust", "cutlass", "cute", "cublas", "cudnn", "flash", "triton"}
# Work that computes nothing (allocation fills, copies): counted on neither side of the share.
NEUTRAL_KERNEL = re.compile(r"Memset|Memcpy|FillFunctor|direct_copy_kernel")


def is_own_kernel(event_name: str, names: list[str]) -> bool:
    """Whether a profiled kernel is one of the candidate's own __global__ functions (not a library kernel)."""
    qualified = re.sub(r"^void\s+|\(anonymous namespace\)::", "", event_name).split("(")[0].split("<")[0].strip()
    *namespaces, base = qualified.split("::")
    return base in names and not LIBRARY_NAMESPACES.intersection(namespaces)


def _own_kernel_share(model, args: list, names: list[str]) -> tuple[float, list[str]] | None:
    """Share of the GPU time of one call spent in the candidate's own kernels, and the top other kernels;
    None where the profiler sees no computing kernel at all."""
    import torch
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        model(*args)
        torch.cuda.synchronize()
    own = total = 0.0
    others: dict[str, float] = {}
    for event in prof.events():
        if event.device_type != DeviceType.CUDA or NEUTRAL_KERNEL.search(event.name):
            continue
        us = event.time_range.elapsed_us()
        total += us
        if is_own_kernel(event.name, names):
            own += us
        else:
            others[event.name[:60]] = others.get(event.name[:60], 0.0) + us
    if total == 0:
        return None
    return own / total, sorted(others, key=others.get, reverse=True)[:3]


def _run(payload: dict) -> dict:
    """Build both models, check the candidate on fresh inputs, profile it, then time both alternately.

    Defences, each named in the feedback when it fires: the candidate runs before the reference on its
    own clone of fresh inputs, into memory poisoned with NaN; its inputs must come back unchanged; it
    runs twice on the first input set and must agree with itself; its own kernels must do the work
    (profiler); every timed output is checked too; the timer and the checks must still be the ones
    this process started with."""
    import threading

    import torch

    times = {}
    defend = payload["defences"]
    device = torch.device(payload["device"])
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.set_device(device)
    start = time.perf_counter()
    task = _import_file(payload["task"], "reference_task")
    torch.manual_seed(payload["seed"])
    init_inputs = task.get_init_inputs()
    torch.manual_seed(payload["seed"])
    reference = task.Model(*init_inputs).to(device).eval()

    def make_inputs(seed: int) -> list:
        """Made on the device where the task does not say otherwise: a gigabyte of random numbers takes
        seconds on the host and milliseconds on a GPU."""
        torch.manual_seed(seed)
        with device:
            inputs = task.get_inputs()
        return [x.to(device) if isinstance(x, torch.Tensor) else x for x in inputs]

    compiled = None
    if payload["compile_baseline"]:  # compiled now: the threads and patches of torch.compile predate the snapshot
        compiled = torch.compile(reference)
        with torch.no_grad():
            compiled(*make_inputs(payload["seed"]))

    profiling = cuda and defend and payload["min_own_kernel_share"] > 0
    if profiling:  # before the snapshot: torch's first profile loads torch._dynamo, which wraps torch.manual_seed
        with torch.no_grad():
            reference_seen = _own_kernel_share(reference, make_inputs(payload["seed"] + 1000), [])
    trusted = _trusted_objects()
    threads = threading.active_count()
    settings = json.dumps(payload, sort_keys=True)

    def rejected(rule_and_why: str) -> dict:
        return {"rejected": rule_and_why, "times": times}

    def tampering() -> dict | None:
        if not defend:
            return None
        now = _trusted_objects()
        changed = [name for name, obj in trusted.items() if now.get(name) is not obj]
        if changed or json.dumps(payload, sort_keys=True) != settings:
            return rejected(f"[patched-checker] the candidate replaced {', '.join(changed[:3]) or 'the settings'}")
        if threading.active_count() > threads:
            return rejected("[threads] the candidate started a thread")
        return None

    candidate = _import_file(payload["candidate"], "candidate")
    torch.manual_seed(payload["seed"])
    try:
        model = candidate.ModelNew(*init_inputs).to(device).eval()
    except Exception as e:  # a candidate whose constructor fails is a runtime error, not a harness error
        return {"stage": "init", "error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()}
    times["load"] = time.perf_counter() - start

    def clone(inputs: list) -> list:
        return [x.clone() if isinstance(x, torch.Tensor) else x for x in inputs]

    def changed(before: list, after: list) -> bool:
        return any(isinstance(b, torch.Tensor) and not _identical(b, a) for b, a in zip(before, after))

    def sync():
        if cuda:
            torch.cuda.synchronize()

    def poison():
        """Fill free device memory with NaN, so that output memory the candidate never writes is NaN."""
        if cuda and defend:
            free = torch.cuda.mem_get_info(device)[0]
            torch.empty(min(free // 2, payload["poison_bytes"]) // 4, device=device).fill_(float("nan"))

    def probe(out) -> list:
        """A few elements of each output, copied to the host in order on the current stream: what a
        caller reading the result right away would see. Copies, unlike kernels, are not held back by a
        kernel still filling the GPU on another stream."""
        probes = []
        for o in _flatten(out):
            if isinstance(o, torch.Tensor) and o.is_contiguous() and o.numel():
                flat = o.reshape(-1)
                picks = sorted({round(i * (o.numel() - 1) / 7) for i in range(8)})
                probes.append(torch.cat([flat[i:i + 1].to("cpu", copy=True) for i in picks]))
        return probes

    def run_candidate(inputs: list):
        """The candidate's output, its (possibly modified) arguments, and whether the output was still
        being written by work not ordered before the current stream when forward returned."""
        poison()
        args = clone(inputs) if defend else inputs
        out = model(*args)
        if not defend:
            sync()
            return out, args, False
        early = probe(out)
        sync()  # device-wide: work left on a side stream finishes now
        unsynchronized = any(not _identical(a, b) for a, b in zip(early, probe(out)))
        return out, args, unsynchronized

    start = time.perf_counter()
    worst = 0.0
    with torch.no_grad():
        for trial in range(payload["correct_trials"]):
            inputs = make_inputs(payload["seed"] + 1 + trial)
            try:
                out, args, unsynchronized = run_candidate(inputs)  # first: no reference result to inherit
                again = run_candidate(inputs)[0] if trial == 0 and defend else None
            except Exception as e:
                return {"stage": "candidate", "error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()}
            if unsynchronized:
                return rejected("[unsynchronized-stream] the output was still being written when forward "
                                "returned: synchronise side streams with the current stream before returning")
            ref_args = clone(inputs) if defend else inputs
            expected = reference(*ref_args)
            sync()
            status, why, diff = _compare(out, expected, payload["atol"], payload["rtol"])
            worst = max(worst, diff)
            if status == "rejected":
                return rejected(why)
            if status:
                return {"incorrect": f"trial {trial + 1} of {payload['correct_trials']}: {why}",
                        "max_abs_diff": diff, "times": times}
            if defend and changed(inputs, args) and not changed(inputs, ref_args):
                return rejected("[modifies-inputs] the candidate changed its input tensors in place")
            if again is not None and _compare(again, out, payload["atol"], payload["rtol"])[0]:
                return rejected("[nondeterministic] two runs on the same inputs disagree "
                                "(a race, or memory read before it is written)")
            del out, again, expected, inputs, args, ref_args
    times["correctness"] = time.perf_counter() - start
    if tampered := tampering():
        return tampered

    timing_inputs = [make_inputs(payload["seed"] + 1000 + i) for i in range(2)]

    def fresh(inputs: list) -> list:
        """A new buffer with slightly new values every trial: nothing can be cached by pointer or content."""
        if not defend:
            return inputs
        return [x * (1 + 1e-3 * (torch.rand_like(x) - 0.5)) if isinstance(x, torch.Tensor) and x.is_floating_point()
                else x.clone() if isinstance(x, torch.Tensor) else x for x in inputs]

    share = None
    if profiling:
        start = time.perf_counter()
        with torch.no_grad():
            measured = _own_kernel_share(model, fresh(timing_inputs[0]), payload["kernel_names"])
        times["profile"] = time.perf_counter() - start
        if measured is None and reference_seen is not None:
            return rejected("[own-kernels-idle] no GPU kernel ran during the candidate's forward")
        if measured is not None:
            share, others = measured
            if share < payload["min_own_kernel_share"]:
                return rejected(f"[own-kernels-idle] your own kernels did {share:.0%} of the GPU work; the rest "
                                f"ran in library kernels ({'; '.join(others)})")

    start = time.perf_counter()
    models = {"candidate": model, "reference": reference}
    if compiled is not None:
        models["compiled"] = compiled
    flush = torch.empty(256 * 2**20 // 4, dtype=torch.int32, device=device) if cuda else None

    def timed(fn, args: list) -> tuple[float, object]:
        if cuda:
            flush.zero_()  # evict the inputs and last results from L2
            begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            begin.record()
            out = fn(*args)
            torch.cuda.synchronize()  # device-wide: work left on side streams is counted
            end.record()
            end.synchronize()
            return begin.elapsed_time(end), out
        begin = time.perf_counter()
        out = fn(*args)
        return (time.perf_counter() - begin) * 1e3, out

    samples = {name: [] for name in models}
    spot_check = random.Random(os.urandom(8))  # which timed outputs get checked: unknowable in advance
    with torch.no_grad():
        for i in range(payload["warmup"]):
            for fn in models.values():
                timed(fn, fresh(timing_inputs[i % 2]))
        deadline = time.perf_counter() + payload["timing_budget_s"]
        for trial in range(payload["timing_trials"]):
            args = fresh(timing_inputs[trial % 2])
            outputs = {}
            for name, fn in models.items():  # alternate, so that clock drift hits both alike
                ms, outputs[name] = timed(fn, clone(args) if defend else args)
                samples[name].append(ms)
            checked = defend and (trial in (0, payload["timing_trials"] - 1) or spot_check.random() < 0.25)
            if checked and _compare(outputs["candidate"], outputs["reference"], payload["atol"], payload["rtol"])[0]:
                return rejected(f"[changed-during-timing] timed run {trial + 1} returned a wrong result "
                                "after the correctness trials had passed")
            del outputs
            if trial + 1 >= 10 and time.perf_counter() > deadline:
                break
    times["timing"] = time.perf_counter() - start
    if tampered := tampering():
        return tampered
    medians = {name: sorted(s)[len(s) // 2] for name, s in samples.items()}
    return {"medians": medians, "trials": len(samples["candidate"]), "max_abs_diff": worst, "times": times,
            "own_kernel_share": share}


# ----------------------------------------------------------------------------------------------------
# Feedback


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


def _last_frames(tb: str, candidate_path: str, limit: int = 6) -> str:
    """The traceback lines that point into the candidate's own code, which the model can act on."""
    lines = tb.splitlines()
    keep = []
    for i, line in enumerate(lines):
        if candidate_path in line:
            keep.append(line.replace(candidate_path, "solution.py").strip())
            if i + 1 < len(lines):  # the source line itself
                keep.append(lines[i + 1].strip())
    return "\n".join(keep[-limit:])


def _first_lines(message: str, n: int = 4) -> str:
    lines = [ln for ln in message.splitlines() if ln.strip()]
    lines = [ln for ln in lines if "CUDA_LAUNCH_BLOCKING" not in ln and "TORCH_USE_CUDA_DSA" not in ln
             and "asynchronously reported" not in ln and not ln.startswith("Search for")]
    return "\n".join(lines[:n])[:1500]


def make_result(status: str, feedback: str, **fields) -> dict:
    result = {"status": status, "compiled": status in ("runtime_error", "incorrect", "correct"),
              "correct": status == "correct", "runtime_ms": None, "ref_runtime_ms": None, "speedup": None,
              "max_abs_diff": None, "feedback": feedback, "time_s": {}}
    result.update(fields)
    return result


def build_feedback(outcome: dict, *, build_root: str, candidate_path: str, timeout_s: float) -> dict:
    """Turn what a build or run child sent back into an eval record with the text the model reads."""
    if outcome.get("timeout"):
        return make_result("timeout", f"Timeout: the kernel did not finish within {timeout_s:.0f} s "
                           "(an infinite loop, a deadlock, or far too slow).")
    if "crash" in outcome:
        log = _first_lines("\n".join(ln for ln in outcome.get("log", "").splitlines()
                                     if re.search(r"error|Error|fault|abort|Abort", ln)))
        return make_result("runtime_error", f"Runtime error: {outcome['crash']}." + (f"\n{log}" if log else ""))
    if "rejected" in outcome:
        return make_result("rejected", f"Rejected by the rules:\n- {outcome['rejected']}", time_s=outcome["times"],
                           compiled=True)  # built and ran, then caught at run time
    if "incorrect" in outcome:
        return make_result("incorrect", f"Incorrect output: {outcome['incorrect']}.",
                           max_abs_diff=outcome["max_abs_diff"], time_s=outcome["times"])
    if "error" in outcome:
        frames = _last_frames(outcome.get("traceback", ""), candidate_path)
        message = _first_lines(outcome["error"])
        return make_result("runtime_error", f"Runtime error: {message}" + (f"\n{frames}" if frames else ""))
    medians = outcome["medians"]
    cand, ref = medians["candidate"], medians["reference"]
    speedup = ref / cand if cand > 0 else math.inf
    extra = {}
    if "compiled" in medians:
        extra = {"compile_ref_runtime_ms": medians["compiled"], "speedup_vs_compile": medians["compiled"] / cand}
    return make_result(
        "correct",
        f"Correct. Your kernel runs in {cand:.4g} ms against {ref:.4g} ms for the PyTorch reference: "
        f"a speedup of {speedup:.2f}x. It can be made faster.",
        runtime_ms=cand, ref_runtime_ms=ref, speedup=speedup, max_abs_diff=outcome["max_abs_diff"],
        time_s=outcome["times"], timing_trials=outcome["trials"], own_kernel_share=outcome["own_kernel_share"],
        **extra)


# ----------------------------------------------------------------------------------------------------
# The scheduler


def _cuda_arch_list() -> str | None:
    """Compute capability of the visible GPUs, read without touching CUDA in this process."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=compute_cap", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30).stdout.split()
    except (OSError, subprocess.SubprocessError):
        return None
    return ";".join(sorted(set(out))) or None


def resolve_device(cfg: EvalConfig) -> tuple[str, list[str]]:
    """('cuda' or 'cpu', the torch devices that run candidates, one worker each)."""
    import torch

    kind = cfg.device
    if kind == "auto":
        kind = "cuda" if torch.cuda.device_count() > 0 else "cpu"
    if kind == "cpu":
        return "cpu", ["cpu"]
    if kind != "cuda":
        raise SystemExit(f"error: --device must be cuda, cpu or auto, not {kind!r}")
    count = torch.cuda.device_count()
    gpus = cfg.gpus if cfg.gpus is not None else list(range(count))
    if not gpus or any(g < 0 or g >= count for g in gpus):
        raise SystemExit(f"error: asked for GPUs {gpus} but {count} are visible")
    return "cuda", [f"cuda:{g}" for g in gpus]


def evaluate(records: list[dict], cfg: EvalConfig | None = None, on_result=None) -> list[dict]:
    """Evaluate many candidates at once; returns one eval dict per record, in order.

    Each record has `task` (an id under cfg.tasks, or a task file) and `code` (a candidate or a whole
    reply). `on_result(index, result)` is called as each finishes. Identical (task, code) pairs are
    evaluated once and share the result."""
    cfg = cfg or EvalConfig()
    kind, devices = resolve_device(cfg)
    index = load_tasks(cfg.tasks) if Path(cfg.tasks).exists() else {}
    build_root = str(Path(cfg.build_dir).resolve())
    Path(build_root).mkdir(parents=True, exist_ok=True)
    workdir = tempfile.mkdtemp(prefix="eval-", dir=build_root)
    env = {"KEVIN_BUILD_ROOT": build_root, "KEVIN_STALE_LOCK_S": str(cfg.compile_timeout_s + 60),
           "TORCH_EXTENSIONS_DIR": build_root}
    if kind == "cuda":
        arch = os.environ.get("TORCH_CUDA_ARCH_LIST") or _cuda_arch_list()
        if arch:
            env["TORCH_CUDA_ARCH_LIST"] = arch
    results: list[dict | None] = [None] * len(records)
    lock = threading.Lock()
    progress = None
    if cfg.progress:
        from tqdm import tqdm

        progress = tqdm(total=len(records), desc=f"evaluate ({kind} x{len(devices)})", file=sys.stderr)

    def finish(indices: list[int], result: dict, started: float):
        result["time_s"] = {**result.get("time_s", {}), "total": round(time.perf_counter() - started, 3)}
        with lock:
            for i in indices:
                results[i] = dict(result, time_s=dict(result["time_s"]))
                if on_result:
                    on_result(i, results[i])
            if progress:
                progress.update(len(indices))

    # 1. parse and apply the static rules; group identical (task, code) pairs
    groups: dict[tuple[str, str], list[int]] = {}
    for i, record in enumerate(records):
        started = time.perf_counter()
        try:
            task_path = str(resolve_task(str(record["task"]), index))
        except (KeyError, ValueError) as e:
            finish([i], make_result("format_error", f"Bad record: {e}"), started)
            continue
        code = extract_code(str(record.get("code") or ""))
        if not code or not code.strip():
            finish([i], make_result("format_error", "Format error: the reply has no complete fenced code "
                                    "block with the solution (```python ... ```)."), started)
            continue
        verdict = static_check(code, kind)
        if verdict:
            finish([i], make_result(*verdict), started)
            continue
        groups.setdefault((task_path, code), []).append(i)

    # 2. build every distinct candidate in the pool; 3. queue each built one for a device worker
    ready: queue.Queue = queue.Queue()
    jobs = []
    for n, ((task_path, code), indices) in enumerate(groups.items()):
        folder = Path(workdir) / f"c{n:05d}"
        folder.mkdir()
        (folder / "solution.py").write_text(code)
        jobs.append((task_path, str(folder / "solution.py"), indices))

    to_run, to_run_lock = [len(jobs)], threading.Lock()  # distinct candidates that may still reach a device

    def fewer_to_run() -> int:
        with to_run_lock:
            to_run[0] -= 1
            return to_run[0]

    compile_slots = threading.Semaphore(max(1, cfg.compile_workers))

    def build(job):
        task_path, candidate, indices = job
        started = time.perf_counter()
        build_env = dict(env, CUDA_VISIBLE_DEVICES="") if "TORCH_CUDA_ARCH_LIST" in env else env
        while True:
            with compile_slots:
                outcome = run_in_child("build", {"candidate": candidate}, build_env, cfg.compile_timeout_s,
                                       str(Path(candidate).with_name("build.log")))
            if "busy" not in outcome:
                break
            _wait_for_build(outcome["busy"])
        if not (outcome.get("timeout") or "crash" in outcome or "error" in outcome):
            ready.put((job, started, outcome["seconds"], outcome["cpu_s"]))
            return
        fewer_to_run()  # it will not reach a device
        if outcome.get("timeout"):
            finish(indices, make_result("timeout", f"Timeout: building took longer than "
                                        f"{cfg.compile_timeout_s:.0f} s."), started)
        else:
            message = outcome.get("error") or outcome["crash"] + "\n" + outcome.get("log", "")
            if "Error building extension" in message:
                message = "Compilation failed:\n" + trim_compiler_output(message, build_root)
            else:
                message = "Loading the module failed: " + _first_lines(message) + "\n" + \
                          _last_frames(outcome.get("traceback", ""), candidate)
            finish(indices, make_result("compile_error", message.strip(),
                                        time_s={"compile": round(time.perf_counter() - started, 3)},
                                        cpu_s={"compile": round(outcome.get("cpu_s", 0.0), 3)}), started)

    def device_worker(device: str):
        logs = (str(Path(workdir) / f"run-{device.replace(':', '')}-{n}.log") for n in itertools.count())
        # each candidate gets a fresh child, set up ahead (no more than there are candidates left to run);
        # the oldest spare has had the longest to get ready
        spares = collections.deque(start_child("run", env, next(logs), device)
                                   for _ in range(min(cfg.spare_children, len(jobs))))
        while (item := ready.get()) is not None:
            left = fewer_to_run()
            (task_path, candidate, indices), started, build_s, build_cpu_s = item
            payload = {"task": task_path, "candidate": candidate, "device": device, "seed": cfg.seed,
                       "correct_trials": cfg.correct_trials, "atol": cfg.atol, "rtol": cfg.rtol,
                       "timing_trials": cfg.timing_trials, "timing_budget_s": cfg.timing_budget_s,
                       "warmup": cfg.warmup, "compile_baseline": cfg.compile_baseline,
                       "min_own_kernel_share": cfg.min_own_kernel_share, "poison_bytes": cfg.poison_bytes,
                       "defences": cfg.defences,
                       "kernel_names": kernel_names(Path(candidate).read_text())}
            child = spares.popleft() if spares else None
            if child is None or not child[0].is_alive():
                child = start_child("run", env, next(logs), device)
            if len(spares) < min(cfg.spare_children, left):
                spares.append(start_child("run", env, next(logs), device))
            run_started, sent_at = time.perf_counter(), time.time()
            outcome = finish_child(child, payload, cfg.run_timeout_s)
            result = build_feedback(outcome, build_root=build_root, candidate_path=candidate,
                                    timeout_s=cfg.run_timeout_s)
            waited = max(0.0, outcome.get("ready_at", sent_at) - sent_at)  # the child was still setting up
            result["time_s"] = {"compile": round(build_s, 3), "run": round(time.perf_counter() - run_started, 3),
                                "wait": round(waited, 3), **{k: round(v, 3) for k, v in result["time_s"].items()}}
            result["cpu_s"] = {"compile": round(build_cpu_s, 3), "run": round(outcome.get("cpu_s", 0.0), 3)}
            finish(indices, result, started)
        for spare in spares:
            stop_child_later(spare)

    workers = [threading.Thread(target=device_worker, args=(d,), daemon=True) for d in devices]
    for w in workers:
        w.start()
    try:
        with ThreadPoolExecutor(max_workers=max(1, len(jobs))) as pool:  # waiting for a build takes no slot
            list(pool.map(build, jobs))
        for _ in workers:
            ready.put(None)
        for w in workers:
            w.join()
    finally:
        if progress:
            progress.close()
        shutil.rmtree(workdir, ignore_errors=True)
    return results


# ----------------------------------------------------------------------------------------------------
# Command line


def summary_table(evals: list[dict], records: list[dict]) -> str:
    """One row per candidate (for small runs), counts per status, then speedups over the correct ones."""
    lines = []
    if len(evals) <= 40:
        lines += ["| candidate | status | speedup | runtime ms | eager ms |", "|---|---|---|---|---|"]
        for record, e in zip(records, evals):
            name = record.get("solution") or record["task"]
            fmt = lambda v: f"{v:.3f}" if isinstance(v, float) else "-"  # noqa: E731
            lines.append(f"| {name} | {e['status']} | {fmt(e['speedup'])} | {fmt(e['runtime_ms'])} "
                         f"| {fmt(e['ref_runtime_ms'])} |")
        lines.append("")
    counts = {s: sum(e["status"] == s for e in evals) for s in STATUSES}
    speedups = [e["speedup"] for e in evals if e["correct"]]
    lines += ["| status | count |", "|---|---|"] + [f"| {s} | {n} |" for s, n in counts.items() if n]
    geomean = math.exp(sum(map(math.log, speedups)) / len(speedups)) if speedups else float("nan")
    lines += [f"| **total** | {len(evals)} |", "",
              f"correct: {len(speedups)}/{len(evals)}; speedup over correct: geomean {geomean:.3f}x, "
              f"max {max(speedups, default=float('nan')):.3f}x; faster than eager: "
              f"{sum(s > 1 for s in speedups)}"]
    return "\n".join(lines)


def library_records(folder: str | Path) -> list[dict]:
    """Hand-written candidates, one record per file, such as those in solutions/cuda/ and solutions/cpu/.

    Files are `<level>/<task stem>.<expected status>_<what>.py`, so such a library checks itself: each
    file's name says what the evaluator must answer (for a rejection, `what` is the rule's name)."""
    files = sorted(Path(folder).rglob("*.py"))
    return [{"task": f"{f.parent.name}/{f.name.split('.')[0]}", "code": f.read_text(),
             "solution": f"{f.parent.name}/{f.name.removesuffix('.py')}"} for f in files]


def check_task(path: Path, device: str, atol: float = 1e-2, rtol: float = 1e-2) -> list[str]:
    """Why a task is degenerate, if it is: a kernel could pass it without computing what it asks.

    Three outputs, from (init seed, input seed) = (42, 1), (42, 2) and (43, 1): the first must not be
    nearly constant, must change with the inputs, and (where the model has parameters) with them."""
    import torch

    task = _import_file(str(path), "reference_task")

    def output(init_seed: int, input_seed: int):
        torch.manual_seed(init_seed)
        init_inputs = task.get_init_inputs()
        torch.manual_seed(init_seed)
        model = task.Model(*init_inputs).to(device).eval()
        torch.manual_seed(input_seed)
        inputs = [x.to(device) if isinstance(x, torch.Tensor) else x for x in task.get_inputs()]
        with torch.no_grad():
            out = model(*inputs)
        return [torch.as_tensor(o).double() for o in _flatten(out)], any(True for _ in model.parameters())

    def same(a: list, b: list) -> bool:
        return all(x.shape == y.shape and torch.allclose(x, y, atol=atol, rtol=rtol) for x, y in zip(a, b))

    base, has_parameters = output(42, 1)
    flags = []
    if same(base, [torch.full_like(o, float(o.mean())) for o in base]):
        flags.append("nearly constant output")
    if same(base, output(42, 2)[0]):
        flags.append("output does not depend on the inputs")
    if has_parameters and same(base, output(43, 1)[0]):
        flags.append("output does not depend on the parameters")
    return flags


def check_tasks(folder: str, device: str) -> int:
    """Print a table of every task's flags; the number of flagged tasks."""
    from tqdm import tqdm

    tasks = load_tasks(folder)
    flagged = 0
    lines = ["| task | flags |", "|---|---|"]
    for task_id, path in tqdm(tasks.items(), desc="checking tasks", file=sys.stderr):
        flags = check_task(path, device)
        flagged += bool(flags)
        lines.append(f"| {task_id} | {'; '.join(flags) or 'ok'} |")
    print("\n".join(lines) + f"\n\n{flagged} of {len(tasks)} tasks flagged", file=sys.stderr)
    return flagged


def read_records(source: str) -> list[dict]:
    """JSONL records from a file or stdin, each checked for `task` and `code`; one-line errors."""
    try:
        text = sys.stdin.read() if source == "-" else Path(source).read_text()
    except OSError as e:
        raise SystemExit(f"error: cannot read {source}: {e.strerror}")
    records = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            raise SystemExit(f"error: {source}:{number}: not valid JSON ({e.msg})")
        if not isinstance(record, dict) or "task" not in record or "code" not in record:
            raise SystemExit(f"error: {source}:{number}: a record needs the fields `task` and `code`")
        records.append(record)
    return records


def main(argv=None):
    defaults = EvalConfig()
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("input", nargs="?", help="JSONL of candidates (`task`, `code`); `-` for stdin; "
                   "default: the hand-written candidates in solutions/<device>/")
    p.add_argument("-o", "--output", help="append results here (resuming a run) instead of stdout")
    p.add_argument("--device", default=defaults.device,
                   help="cuda (CUDA candidates), cpu (C++ candidates) or auto (cuda when a GPU is visible)")
    p.add_argument("--gpus", help="comma-separated GPU indices to use (default: all visible)")
    p.add_argument("--tasks", help="task folder that task ids are resolved against (default: tasks/; for the "
                   "CPU demo, the CPU-sized copies in tests/tasks/)")
    p.add_argument("--correct-trials", type=int, default=defaults.correct_trials,
                   help="fresh random input sets the candidate must match")
    p.add_argument("--atol", type=float, default=defaults.atol, help="absolute tolerance")
    p.add_argument("--rtol", type=float, default=defaults.rtol, help="relative tolerance")
    p.add_argument("--timing-trials", type=int, default=defaults.timing_trials, help="timed runs per model")
    p.add_argument("--timing-budget-s", type=float, default=defaults.timing_budget_s,
                   help="time budget for the timed runs of one candidate (at least 10 trials)")
    p.add_argument("--warmup", type=int, default=defaults.warmup, help="untimed runs per model first")
    p.add_argument("--compile-baseline", action="store_true", help="also time torch.compile(Model)")
    p.add_argument("--min-own-kernel-share", type=float, default=defaults.min_own_kernel_share,
                   help="least share of GPU time in the candidate's own kernels (profiled; 0 turns it off)")
    p.add_argument("--seed", type=int, default=defaults.seed, help="seed before init inputs and each model")
    p.add_argument("--compile-workers", type=int, default=defaults.compile_workers,
                   help="candidates built at once")
    p.add_argument("--spare-children", type=int, default=defaults.spare_children,
                   help="checking children started ahead on each GPU (each holds a CUDA context while it waits)")
    p.add_argument("--compile-timeout-s", type=float, default=defaults.compile_timeout_s,
                   help="limit for building one candidate")
    p.add_argument("--run-timeout-s", type=float, default=defaults.run_timeout_s,
                   help="limit for checking and timing one candidate")
    p.add_argument("--build-dir", default=defaults.build_dir, help="extension build cache")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--check-tasks", metavar="DIR", help="instead of evaluating, flag degenerate tasks in DIR "
                   "(constant output, or insensitive to inputs or parameters); exit status 1 if any")
    args = p.parse_args(argv)
    if args.check_tasks:
        sys.exit(1 if check_tasks(args.check_tasks, resolve_device(EvalConfig(device=args.device))[1][0]) else 0)

    try:
        gpus = [int(g) for g in args.gpus.split(",")] if args.gpus else None
    except ValueError:
        raise SystemExit(f"error: --gpus takes comma-separated integers, not {args.gpus!r}")
    demo_on_cpu = args.input is None and resolve_device(EvalConfig(device=args.device, gpus=gpus))[0] == "cpu"
    tasks = args.tasks or str(ROOT / "tests" / "tasks" if demo_on_cpu else defaults.tasks)
    cfg = EvalConfig(device=args.device, gpus=gpus, tasks=tasks, correct_trials=args.correct_trials,
                     atol=args.atol, rtol=args.rtol, timing_trials=args.timing_trials,
                     timing_budget_s=args.timing_budget_s, warmup=args.warmup,
                     compile_baseline=args.compile_baseline, min_own_kernel_share=args.min_own_kernel_share,
                     seed=args.seed,
                     compile_workers=args.compile_workers, spare_children=args.spare_children,
                     compile_timeout_s=args.compile_timeout_s,
                     run_timeout_s=args.run_timeout_s, build_dir=args.build_dir, progress=not args.no_progress)
    source = args.input
    if source is None:
        kind, _ = resolve_device(cfg)
        source = f"solutions/{kind}"
        print(f"no input: evaluating the hand-written candidates in {source}/", file=sys.stderr)
        records = library_records(ROOT / "solutions" / kind)
    else:
        records = read_records(source)
    index = load_tasks(cfg.tasks) if Path(cfg.tasks).exists() else {}
    for number, record in enumerate(records, 1):
        try:
            resolve_task(str(record["task"]), index)
        except ValueError as e:
            raise SystemExit(f"error: {source}: record {number}: {e}")

    done = 0
    if args.output and Path(args.output).exists():
        done = sum(1 for line in Path(args.output).read_text().splitlines() if line.strip())
        print(f"resuming: {done} of {len(records)} already in {args.output}", file=sys.stderr)
    # The demo prints only its table unless asked to keep the records; a pipeline gets them on stdout.
    out = open(args.output, "a") if args.output else open(os.devnull, "w") if args.input is None else sys.stdout
    pending, written = {}, []

    def write_in_order(i: int, result: dict):
        pending[i] = result
        while len(written) in pending:  # results come in any order; lines go out in input order
            result = pending.pop(len(written))
            out.write(json.dumps({**records[done + len(written)], "eval": result}) + "\n")
            out.flush()
            written.append(result)

    evaluate(records[done:], cfg, on_result=write_in_order)
    if out is not sys.stdout:
        out.close()
    print(summary_table(written, records[done:]), file=sys.stderr)


if __name__ == "__main__":
    main()
