"""Build acceleration for load_inline: each distinct extension is compiled once, past most of torch's headers.

Candidates in a GRPO group and a model's later turns often repeat an extension word for word (or up to its
name); building each once, in a folder named by the hash of load_inline's arguments, and against light
stand-ins for torch/types.h and torch/extension.h (main.cpp's precompiled) cuts the build, which is most of
an evaluation's CPU time. evaluate.py installs it in each build and run child (`content_addressed_load_inline`).
Nothing here imports torch.utils.cpp_extension at import time: a forked child that has imported it cannot
use CUDA.
"""
from __future__ import annotations

import contextlib
import fcntl
import hashlib
import inspect
import json
import os
import re
import shlex
import subprocess
import threading
import time
from pathlib import Path

HEAVY_INCLUDE = re.compile(r'^[ \t]*#[ \t]*include[ \t]*[<"]torch/extension\.h[>"]', re.M)
# What a compiler says when a declaration is missing, as a lighter header could cause; other errors (syntax,
# types) come out the same under either header, so the source is not built a second time for them.
MISSING_NAME = re.compile(r"undefined|no member|not a member|class or namespace|incomplete type|no instance|"
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


def content_addressed_load_inline(build_root: str, building: bool, stale_lock_s: float):
    """Wrap load_inline so that each distinct extension is built once, in a folder named by its inputs,
    and faster than as written (see `_fast_load_inline`). Copies that differ only in the extension's name,
    as samples of one group and a model's later turns often do, share one build under a name made from
    the rest, unless their sources spell the name out (their own PYBIND11_MODULE, say). In a build job
    (`building`), an extension that another process is building raises BuildUnderWay. A build lock older than
    `stale_lock_s` was left by a build that was killed, and is removed."""
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
        if lock.exists() and time.time() - lock.stat().st_mtime > stale_lock_s:
            lock.unlink(missing_ok=True)
        arguments["build_directory"] = str(folder)
        to_build = building and not (folder / f"{arguments['name']}.so").exists()
        with _claim(folder) if to_build else contextlib.nullcontext():
            return _fast_load_inline(original, arguments, folder, Path(build_root), make_pch=building)

    cpp_ext.load_inline = load_inline


@contextlib.contextmanager
def _claim(folder: Path):
    """Held by the one build job that builds the extension in `folder` (the lock goes with its process);
    another that finds it held raises BuildUnderWay, and its parent waits in `wait_for_build`."""
    with open(folder / "claim", "w") as claim:
        try:
            fcntl.flock(claim, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            raise BuildUnderWay(claim.name) from None
        yield


def wait_for_build(claim: str) -> None:
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
        write_light_headers(light)

    def build():
        kwargs = dict(arguments)
        if took_light:
            kwargs["cuda_sources"] = [HEAVY_INCLUDE.sub("#include <torch/types.h>", s) for s in cuda]
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
            if not took_light or not any(MISSING_NAME.search(line) for line in errors):
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


def write_light_headers(folder: Path) -> None:
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

