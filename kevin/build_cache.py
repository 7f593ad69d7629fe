"""Build acceleration for load_inline: each distinct extension is compiled once, past most of torch's headers.

Candidates in a GRPO group and a model's later turns often repeat an extension word for word (or up to its
name); building each once, in a folder named by the hash of load_inline's arguments, and against light
stand-ins for torch/types.h, torch/extension.h (main.cpp's precompiled) and ATen/DeviceGuard.h cuts the
build, which is most of an evaluation's CPU time.

The cache is shared by candidates, so no candidate writes it: a child that runs candidate code asks the
evaluator for each extension its load_inline names (`load_from_cache`), the evaluator has it compiled by a
child that runs no candidate code (`BuildCache`, `compile_extension`), records the library's digest, and
tells the child which verified library to load. The flags a candidate passes reach the build's shell unquoted:
each must be one plain argument, or the request is refused before anything is compiled (`refused_argument`).
The light headers shared by every build with the same flags are written by the evaluator, and their precompiled
header by a compile child that may write nothing else; each is checked before every build that uses it.
A build child's job is `build_candidate`: importing the candidate, so that its load_inline calls have
every extension built (or find it built) before its runner imports it.
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
import shutil
import subprocess
import tempfile
import threading
import time
from pathlib import Path

HEAVY_INCLUDE = re.compile(r'^[ \t]*#[ \t]*include[ \t]*[<"]torch/extension\.h[>"]', re.M)
# What a compiler says when a declaration is missing, as a lighter header could cause; other errors (syntax,
# types) come out the same under either header, so the source is not built a second time for them.
MISSING_NAME = re.compile(r"undefined|no member|not a member|class or namespace|incomplete type|no instance|"
                           r"no suitable|not a template|not declared|no matching|cannot open|identifier|"
                           r"no operator|no storage class", re.I)
# A build is first tried against light stand-ins for torch's headers, found first on the compilers'
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
_LIGHT_OPS = ("empty", "empty_like", "empty_strided", "from_blob", "zeros", "zeros_like", "ones", "ones_like", "full",
              "full_like", "arange", "rand", "randn", "matmul", "mm", "bmm", "addmm", "sum",
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
# ATen/DeviceGuard.h, which every per-operator header includes: the real one declares device_of for a list of
# tensors, whose list type pulls in c10::List and IValue: a third of the CUDA file's compile (nvcc's CPU time on the
# 29 CUDA files of solutions/ that build light, median 16.0 s against 10.6 with the stand-in, on 2 cores). The
# stand-in gives device_of for a tensor and an optional one; cat and stack, whose signatures need the list type, are
# left out of the light operators, so a source calling them misses a name.
_LIGHT_DEVICE_GUARD_H = (
    "// evaluate.py's light stand-in for ATen/DeviceGuard.h in a build's first attempt\n#pragma once\n"
    "#include <ATen/core/Tensor.h>\n#include <c10/core/DeviceGuard.h>\nnamespace at {\n"
    "inline std::optional<Device> device_of(const Tensor& t) {\n"
    "  return t.defined() ? std::optional<Device>(t.device()) : std::nullopt;\n}\n"
    "inline std::optional<Device> device_of(const std::optional<Tensor>& t) {\n"
    "  return t.has_value() ? device_of(*t) : std::nullopt;\n}\n}  // namespace at\n")
_LIGHT_HEADERS = {"torch/types.h": _LIGHT_TYPES_H, "torch/extension.h": _LIGHT_EXTENSION_H,
                  "ATen/DeviceGuard.h": _LIGHT_DEVICE_GUARD_H}

# One argument, as the build passes it on: ninja hands load_inline's flags to a shell unquoted, so anything else
# (`;`, `$(...)`, a quote, a newline) could run a command in the compile child. '@' is left out: `@file` reads
# more options from a file. A flag of several such words separated by spaces is taken word by word.
_PLAIN = re.compile(r"[A-Za-z0-9_+=,.:/%-]+")
# Options that make a compiler or linker write a file they name (outside the build folder, or over one of its
# files), or run or load a program of their choosing; checked in every comma-separated piece of a flag (-Wl,...,
# -Xcompiler=...) and the value after its '='. The compile child's Landlock domain is the fence (ld also takes
# abbreviations of its long options, such as --Ma for --Map); this list gives the model a refusal it can read.
_WRITES_OR_RUNS = ("-o", "--output", "-MF", "-save-temps", "-dumpdir", "-dumpbase", "-aux-info", "-fdump-",
                   "-fopt-info", "-keep", "--keep", "-time", "--time", "-Map", "--Map", "--version-script",
                   "--dependency-file", "-fplugin", "-plugin", "--plugin", "-B", "-specs", "--specs", "-wrapper",
                   "-ccbin", "--compiler-bindir", "-Xlinker", "--linker-options", "-Xnvlink", "--nvlink-options",
                   "-optf", "--options-file")
# Options whose value may come as the next argument (`-gencode arch=compute_90,code=sm_90`, `-Xptxas -v`): the
# only place a word that is not a flag may stand.
_TAKES_VALUE = {"-gencode", "--generate-code", "-arch", "--gpu-architecture", "-code", "--gpu-code", "-Xptxas",
                "--ptxas-options", "-Xcompiler", "--compiler-options", "-maxrregcount", "--maxrregcount", "-std",
                "-D", "-U", "-I", "-L", "-l", "-x", "-include", "-isystem"}
_FLAG_ARGUMENTS = ("extra_cflags", "extra_cuda_cflags", "extra_sycl_cflags", "extra_ldflags")
_PLAIN_WORDS = "letters, digits and _+=,.:/%-"


def _sources(arguments: dict, kind: str) -> list[str]:
    """load_inline's cpp_sources or cuda_sources, which may be one string or a list of them, as a list."""
    sources = arguments.get(kind)
    return [sources] if isinstance(sources, str) else list(sources or [])


def extension_key(arguments: dict, arch: str) -> tuple[str, dict]:
    """The digest naming an extension's build folder, and load_inline's arguments as that build takes them.
    Copies that differ only in the extension's name, as samples of one group and a model's later turns often
    do, share one build under a name made from the rest, unless their sources spell the name out (their own
    PYBIND11_MODULE, say). Where the candidate asked to build, and how verbosely, change nothing built."""
    import torch

    arguments = {k: v for k, v in arguments.items() if k not in ("build_directory", "verbose")}
    written = "\n".join(_sources(arguments, "cpp_sources") + _sources(arguments, "cuda_sources"))
    if not re.search(rf"\b{re.escape(str(arguments.get('name')))}\b", written):
        arguments.pop("name", None)
    key = repr(sorted(arguments.items())) + torch.__version__ + arch
    digest = hashlib.sha256(key.encode()).hexdigest()[:20]
    arguments.setdefault("name", f"ext_{digest}")
    return digest, arguments


def library_path(root: Path, arguments: dict, arch: str) -> tuple[str, dict, Path]:
    """(`extension_key`'s digest and arguments, and where the extension's library is) in the cache at `root`."""
    digest, arguments = extension_key(arguments, arch)
    return digest, arguments, root / digest / f"{arguments['name']}.so"


def refused_argument(arguments: dict) -> str | None:
    """Why load_inline's arguments, as the build takes them (`extension_key`), cannot be built: one line naming the
    argument, for the candidate's feedback; None where they can. The name, the flags and the include paths are
    written into the build's ninja file, whose commands a shell runs: each must be plain words, and no flag may
    make the compiler write or run what it names."""
    if not str(arguments.get("name")).isidentifier():
        return f"the extension's name {_shown(arguments.get('name'))} is refused: it must be a Python identifier"
    for key in (*_FLAG_ARGUMENTS, "extra_include_paths"):
        values = arguments.get(key) or []
        if not (isinstance(values, list) and all(isinstance(v, str) for v in values)):
            return f"{key} {_shown(values)} is refused: it must be a list of strings"
        refused = _refused_paths(values) if key == "extra_include_paths" else _refused_flags(values)
        if refused:
            return f"{key}: {_shown(refused[0])} is refused: {refused[1]}"
    return None


def _refused_paths(paths: list[str]) -> tuple[str, str] | None:
    for path in paths:
        if not _PLAIN.fullmatch(path.strip()) or path.strip().startswith("-"):
            return path, f"an include path must be a plain path ({_PLAIN_WORDS}, not starting with -)"
    return None


def _refused_flags(flags: list[str]) -> tuple[str, str] | None:
    previous = ""
    for flag in flags:
        for word in filter(None, flag.strip().split(" ")):
            if not _PLAIN.fullmatch(word):
                return flag, f"a flag must be plain words ({_PLAIN_WORDS}): the build passes it to a shell unquoted"
            if not word.startswith("-") and previous not in _TAKES_VALUE:
                return flag, f"{word!r} is not a flag (it must start with -), nor the value of one that takes one"
            pieces = word.split(",")
            if any(p.startswith(_WRITES_OR_RUNS) for p in pieces + [p.split("=", 1)[1] for p in pieces if "=" in p]):
                return flag, "it makes the compiler or linker write a file it names, or run a program; a build " \
                             "writes only its own folder"
            previous = word
    return None


def _shown(value) -> str:
    text = repr(value)
    return text if len(text) <= 100 else text[:97] + "..."


def light_folder(arguments: dict, build_root: Path) -> Path:
    """The folder of the light headers (and main.cpp's precompiled one) for this extension's compiler flags."""
    import importlib.util

    cpp_extension = importlib.util.find_spec("torch.utils.cpp_extension").origin
    key = repr([arguments.get("extra_cflags"), arguments.get("extra_include_paths"),
                bool(_sources(arguments, "cuda_sources")), arguments.get("with_cuda"), os.environ.get("CXX"),
                cpp_extension, _LIGHT_HEADERS])
    return build_root / "light" / hashlib.sha256(key.encode()).hexdigest()[:16]


def load_from_cache(ask) -> None:
    """In a child that runs candidate code: load_inline asks the evaluator (`ask`) for the extension, which a
    compile child that runs no candidate code builds once in the cache, and loads the library it is told
    of. So the child writes nothing shared, and what it loads was compiled from the sources it named."""
    import importlib.util

    import torch
    import torch.utils.cpp_extension as cpp_ext

    signature = inspect.signature(cpp_ext.load_inline)

    def load_inline(*args, **kwargs):
        arguments = dict(signature.bind(*args, **kwargs).arguments)
        reply = ask(arguments)
        if "error" in reply:
            raise RuntimeError(reply["error"])
        if not arguments.get("is_python_module", True):
            torch.ops.load_library(reply["library"])
            return reply["library"]
        spec = importlib.util.spec_from_file_location(reply["name"], reply["library"])
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module

    cpp_ext.load_inline = load_inline


def build_candidate(payload: dict) -> dict:
    """The build child's job: import the candidate, whose load_inline has the evaluator build its extensions (or
    finds them built)."""
    from kevin.harness import import_file

    start = time.perf_counter()
    import_file(payload["candidate"], "candidate")
    return {"seconds": time.perf_counter() - start}


def compile_extension(payload: dict) -> dict:
    """A compile child's job: build one extension in its folder without loading it, so that no candidate code
    (its static initialisers included) runs where the cache is written; or, for a payload that says
    `precompile`, the light folder's precompiled header."""
    import torch.utils.cpp_extension as cpp_ext

    cpp_ext._import_module_from_library = lambda *args: None  # torch's last step of a build: the import
    try:
        if payload.get("precompile"):
            _precompile_header(cpp_ext.load_inline, payload["arguments"], Path(payload["light"]))
        else:
            _fast_load_inline(cpp_ext.load_inline, payload["arguments"], Path(payload["folder"]),
                              Path(payload["light"]))
    except Exception as e:  # noqa: BLE001 - the compiler's message goes to the candidate's feedback
        return {"error": str(e)}
    return {"built": True}


class BuildCache:
    """The evaluator's side of the cache. A child's load_inline becomes a `request` here: each extension is
    compiled once by `compile(payload, writable, timeout_s)` (a compile child that may write only the
    extension's folder); the library's digest is recorded after the build and checked before any child is
    told to load it, so a library changed since is rebuilt, never loaded. The light headers and their
    precompiled header, which every build with the same flags reads, are checked before each build
    (`_check_light`) and written by no child that builds an extension.

    `slots` bounds the build work going on at once: a build child holds one (`slot()`) while it imports its
    candidate and while the extensions it asks for are compiled, and gives it back while it waits for an
    extension another child's request is building. A file lock beside each folder keeps other evaluators
    sharing the cache out while it is built. `shared` (on a cluster, kevin/ray_pool.py) is asked for another node's
    build before one is compiled here, and told of each build done here."""

    def __init__(self, root: Path, arch: str, slots: int, compile, timeout_s: float, shared=None):
        self.root, self.arch, self.compile, self.timeout_s = root, arch, compile, timeout_s
        self.shared = shared
        self.slots = threading.Semaphore(max(1, slots))
        self.locks: dict[str, threading.Lock] = {}  # by extension digest, and by light folder
        self.guard = threading.Lock()
        self.unmade: set[Path] = set()  # light folders whose precompiled header failed to build in this run
        self.holding = threading.local()  # whether this thread's child holds a slot; its compiles' CPU time

    @contextlib.contextmanager
    def slot(self, needed: bool = True):
        """Hold a slot for this thread (none where `needed` is False or it holds one already)."""
        if not needed or getattr(self.holding, "slot", False):
            yield
            return
        with self.slots:
            self.holding.slot = True
            try:
                yield
            finally:
                self.holding.slot = False

    @contextlib.contextmanager
    def _slot_given_back(self):
        held = getattr(self.holding, "slot", False)
        if held:
            self.holding.slot = False
            self.slots.release()
        try:
            yield
        finally:
            if held:
                self.slots.acquire()
                self.holding.slot = True

    def compile_cpu_s(self) -> float:
        """CPU-seconds of the compiles this thread's requests ran since the last call (compilers included)."""
        spent, self.holding.cpu_s = getattr(self.holding, "cpu_s", 0.0), 0.0
        return spent

    def request(self, arguments: dict) -> dict:
        """{'library': path, 'name': module name}, {'error': the compiler's message} or {'timeout': True}."""
        digest, arguments, library = library_path(self.root, arguments, self.arch)
        refused = refused_argument(arguments)
        if refused:  # before anything is compiled
            name = arguments["name"] if str(arguments["name"]).isidentifier() else "extension"
            return {"error": f"Error building extension '{name}': {refused}"}
        folder = library.parent
        with self.guard:
            lock = self.locks.setdefault(digest, threading.Lock())
        if lock.acquire(blocking=False):
            outcome = self._made(lock, digest, arguments, folder, library)
        else:
            # another request is building it: wait, and look at what it made, with no slot, taken back only once the
            # lock is let go (a waiter that took it back first held the lock while it waited for a slot, and a run's
            # request for the same extension waited on other candidates' builds: an honest kernel timed out so)
            with self._slot_given_back():
                lock.acquire()
                outcome = self._made(lock, digest, arguments, folder, library)
        return outcome or {"library": str(library), "name": arguments["name"]}

    def _made(self, lock: threading.Lock, digest: str, arguments: dict, folder: Path, library: Path) -> dict | None:
        """With the extension's lock held (let go here): its library built where it is not yet (across processes
        too), and None, or the build's failure."""
        try:
            with open(self.root / f"{digest}.lock", "w") as held:
                fcntl.flock(held, fcntl.LOCK_EX)
                if _matches_digest(library) or self._shipped(digest, library):
                    return None
                with self.slot():  # a run child's request holds none of its own
                    outcome = self._build(dict(arguments, build_directory=str(folder)), folder, library)
                if self.shared is not None:
                    self.shared.publish(digest, None if outcome else library)
                return outcome
        finally:
            lock.release()

    def _shipped(self, digest: str, library: Path) -> bool:
        """Whether another node's build of the extension is now `library` (waiting for one gives the slot back)."""
        if self.shared is None:
            return False
        with self._slot_given_back():
            return self.shared.fetch(digest, library)

    def _build(self, arguments: dict, folder: Path, library: Path) -> dict | None:
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        light = light_folder(arguments, self.root)
        maker = self._check_light(arguments, light) if takes_light(arguments, light) else None
        outcome = self.compile({"arguments": arguments, "folder": str(folder), "light": str(light)},
                               [str(folder)], self.timeout_s)
        self._count_cpu(outcome)
        if maker is not None:  # the precompiled header's CPU time is this build's too
            maker.join()
            self._count_cpu(maker.outcome)
        if outcome.get("built") and library.exists():
            _record_digest(library)
            return None
        if outcome.get("timeout"):
            return {"timeout": True}
        return {"error": outcome.get("error") or f"Error building extension: {outcome.get('crash')}\n"
                                                 f"{outcome.get('log', '')}"}

    def _check_light(self, arguments: dict, light: Path) -> threading.Thread | None:
        """Before a build reads them: the light headers written again where they are not their text, and the
        precompiled header removed where it is not what was recorded when it was made. A missing one is made
        alongside the build that finds it missing (which reads the text), as the thread returned
        (`_precompile`); other builds meanwhile go on without it."""
        write_light_headers(light)
        pch = light / "torch" / "extension.h.gch"
        if pch.exists() and not _matches_digest(pch):
            pch.unlink(missing_ok=True)  # another build may have found it first
        with self.guard:
            lock = self.locks.setdefault(str(light), threading.Lock())
            if pch.exists() or light in self.unmade or not lock.acquire(blocking=False):
                return None
        maker = threading.Thread(target=self._precompile, args=(arguments, light, lock), daemon=True)
        maker.start()
        return maker

    def _precompile(self, arguments: dict, light: Path, lock: threading.Lock) -> None:
        """The precompiled header of `light`, made by a compile child that may write only that folder and gets
        only the flags that name it, into a partial file: its digest is recorded here, then it is put in place.
        The child's outcome is left in this thread's `outcome`."""
        threading.current_thread().outcome = {}
        try:
            with open(light / "lock", "w") as held:
                try:
                    fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except OSError:
                    return  # another evaluator is making it
                pch = light / "torch" / "extension.h.gch"
                if pch.exists():  # made by another evaluator since it was found missing
                    return
                partial = pch.with_suffix(".gch.partial")
                partial.unlink(missing_ok=True)
                outcome = self.compile({"precompile": True, "arguments": arguments, "light": str(light)},
                                       [str(light)], self.timeout_s)
                threading.current_thread().outcome = outcome
                if outcome.get("built") and partial.exists():
                    _record_digest(pch, partial)
                    partial.rename(pch)
                else:
                    self.unmade.add(light)  # a header that fails with these flags fails again
        finally:
            lock.release()

    def _count_cpu(self, outcome: dict) -> None:
        self.holding.cpu_s = getattr(self.holding, "cpu_s", 0.0) + outcome.get("cpu_s", 0.0)


def _digest_file(path: Path) -> Path:
    return path.with_name(path.name + ".sha256")


def _sha256(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _record_digest(path: Path, source: Path | None = None) -> None:
    """The digest of `path` (of `source`, the partial file that becomes it, where given), written beside and renamed
    over, never into the old file: whoever reads it sees one digest or the other, and a digest file linked from
    elsewhere (the suite links one cache's headers into the next) keeps its own."""
    _write_whole(_digest_file(path), _sha256(source or path))


def _write_whole(target: Path, text: str) -> None:
    """`text` written beside `target` and renamed over it (a name of this process and thread: the evaluator's
    threads write too), so that a reader sees the old file or the new one, and a link to the old keeps it."""
    partial = target.with_name(f"{target.name}.{os.getpid()}.{threading.get_ident()}")
    partial.write_text(text)
    os.replace(partial, target)


def _matches_digest(path: Path) -> bool:
    """Whether `path` exists and is what the build that made it recorded."""
    try:
        return _digest_file(path).read_text() == _sha256(path)
    except OSError:
        return False


def takes_light(arguments: dict, light: Path) -> bool:
    """Whether a build first tries the light headers: not for a source that names what they lack in ways that
    may not fail as a missing name (`_BEYOND_LIGHT`), nor where the folder's path would split on a space."""
    sources = _sources(arguments, "cpp_sources") + _sources(arguments, "cuda_sources")
    return not any(_BEYOND_LIGHT.search(s) for s in sources) and not re.search(r"\s", str(light))


def light_cuda_source(source: str) -> str:
    """A CUDA source as its build against the light headers compiles it: torch/extension.h becomes torch/types.h."""
    return HEAVY_INCLUDE.sub("#include <torch/types.h>", source)


def _fast_load_inline(original, arguments: dict, folder: Path, light: Path):
    """load_inline past most of torch's headers, which are >95% of a build: its CUDA file and its main.cpp
    are compiled against the light headers (`_LIGHT_HEADERS`) in `light`, first on
    both compilers' include paths, torch/extension.h included by a CUDA source becoming torch/types.h (the
    Python bindings are compiled in main.cpp). If that fails for a missing name, the source as written is
    built (any other error is the same under both); one that names what the light headers lack in other
    ways is built as written from the start (`takes_light`). `light` is one folder per set of compiler flags
    (`light_folder`), which the evaluator keeps, with torch/extension.h precompiled under those flags: main.cpp
    picks that up where it exists. Whether a build took the light headers is recorded in its folder."""
    import torch.utils.cpp_extension as cpp_ext

    cuda = _sources(arguments, "cuda_sources")
    record = folder / "shortcuts.json"
    took_light = takes_light(arguments, light)
    record.write_text(json.dumps({"light": took_light}))

    def build():
        kwargs = dict(arguments)
        if took_light:
            kwargs["cuda_sources"] = [light_cuda_source(s) for s in cuda]
            kwargs["extra_cflags"] = [f"-I{light}"] + list(arguments.get("extra_cflags") or [])
            kwargs["extra_cuda_cflags"] = [f"-I{light}"] + list(arguments.get("extra_cuda_cflags") or [])
        return original(**kwargs)

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


def write_light_headers(folder: Path) -> None:
    """The light headers (`_LIGHT_HEADERS`) in folder, each written (atomically: builds may be reading it) where
    it is missing or not its text."""
    for name, text in _LIGHT_HEADERS.items():
        target = folder / name
        with contextlib.suppress(OSError):
            if target.read_text() == text:
                continue
        target.parent.mkdir(parents=True, exist_ok=True)
        _write_whole(target, text)


class _NinjaFileWritten(Exception):
    pass


def _precompile_header(original, arguments: dict, light: Path) -> None:
    """Precompile the light torch/extension.h into light/torch/extension.h.gch.partial (the evaluator records
    its digest and puts it in place) with the flags ninja gives a build's main.cpp under these arguments:
    load_inline writes its build file for an empty extension with the flags that name the light folder (the
    other flags and the sources, which no build but the candidate's own reads, are left out) and stops before
    compiling. The extension's name is left out too: gcc refuses a header made under another value of a macro,
    and torch's headers never read this one."""
    import torch.utils.cpp_extension as cpp_ext

    def stop(*args, **kwargs):
        raise _NinjaFileWritten

    cpp_ext._run_ninja_build = stop
    folder = Path(tempfile.mkdtemp())  # in the child's private folder
    with_cuda = arguments.get("with_cuda")
    with contextlib.suppress(_NinjaFileWritten):
        original("light_header", "", extra_cflags=[f"-I{light}", *(arguments.get("extra_cflags") or [])],
                 extra_include_paths=arguments.get("extra_include_paths"), build_directory=str(folder),
                 with_cuda=bool(_sources(arguments, "cuda_sources")) if with_cuda is None else with_cuda)
    ninja = (folder / "build.ninja").read_text()
    flags, compiler = re.search(r"^cflags = (.*)$", ninja, re.M), re.search(r"^cxx = (.*)$", ninja, re.M)
    own_flags = re.sub(r"-DTORCH_EXTENSION_NAME=\S+", "", flags.group(1))
    header = light / "torch" / "extension.h"
    command = shlex.split(compiler.group(1)) + shlex.split(own_flags) + \
        ["-x", "c++-header", str(header), "-o", str(header.with_name("extension.h.gch.partial"))]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"precompiling the light torch/extension.h failed:\n{done.stderr[-2000:]}")
