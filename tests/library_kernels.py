"""The CUDA kernels compiled into a built extension, read from the library, not from the source that was written.

The source's `__global__` names (static_rules.kernel_names) miss what the text does not spell: kernels stamped out
by macros the reader cannot expand, and those a library header instantiates (cub's DeviceReduce). Every kernel
that can run is an entry function of a cubin in the library's fat binary; `cuobjdump -symbols` lists each cubin's
symbols and marks the entries STO_ENTRY (cuobjdump 13.2 on nvcc 13.0's output):

    STT_FUNC         STB_GLOBAL STO_ENTRY      _ZN5mylib10add_kernelEPfPKfi
    STT_FUNC         STB_LOCAL  STO_ENTRY      _ZN36_GLOBAL__N__41bfd65a_4_k_cu_66177bc813hidden_kernelEPf

(a `__device__` function is STT_FUNC with STO_DEFAULT: not an entry). A name is Itanium-mangled, or as written
for an `extern "C"` kernel; base_name reads from it the namespaces and the name that the profiler shows.

The evaluator reads no library: it checks the source's names. This is the tests' reading of what was built, which
tests/test_static_rules.py holds those names to.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sysconfig
from pathlib import Path

KERNEL_ENTRY = re.compile(r"^STT_FUNC\s+STB_\w+\s+STO_ENTRY\s+(\S+)$", re.MULTILINE)
SOURCE_NAME_LENGTH = re.compile(r"[1-9]\d*")
ANONYMOUS_NAMESPACE = "(anonymous namespace)"


def cuobjdump() -> str | None:
    """The cuobjdump beside the compiler: on PATH, in $CUDA_HOME/bin (the toolkit, where nvcc on PATH is a
    wrapper), or from PyPI's nvidia-cuda-cuobjdump wheel, which the pip-installed toolkits lack."""
    toolkit = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH") or "/usr/local/cuda"
    wheels = [str(folder) for folder in sorted(Path(sysconfig.get_paths()["purelib"], "nvidia").glob("cu*/bin"))]
    return shutil.which("cuobjdump", path=os.pathsep.join([os.environ.get("PATH", ""), f"{toolkit}/bin", *wheels]))


def base_name(symbol: str) -> tuple[tuple[str, ...], str]:
    """(namespaces, name) of a kernel's symbol, as the profiler demangles it: `_ZN5mylib10add_kernelEPfPKfi` ->
    (("mylib",), "add_kernel"). Reads the Itanium prefix only: `_Z` and one source name, or a nested `_ZN` of them
    up to the template arguments (`I...E`) or the end (`E`); a kernel is never a class member, so nothing else
    stands there. An anonymous namespace (`_GLOBAL__N_1`, nvcc's `_GLOBAL__N__<hash>`) reads as the demangler
    writes it; a name that is not mangled (extern "C") is its own."""
    nested = symbol.startswith("_ZN")
    parts: list[str] = []
    position = 3 if nested else 2
    while symbol.startswith("_Z") and (nested or not parts) and (length := SOURCE_NAME_LENGTH.match(symbol, position)):
        position = length.end() + int(length[0])
        parts.append(symbol[length.end():position])
    if not parts:
        return (), symbol
    parts = [ANONYMOUS_NAMESPACE if part.startswith("_GLOBAL__N") else part for part in parts]
    return tuple(parts[:-1]), parts[-1]


def kernel_symbols(library: str | Path) -> list[str] | None:
    """The symbols of the kernel entries in `library`'s cubins, each once (a cubin per architecture holds the same);
    [] for a library without device code. None where they cannot be read: no cuobjdump, cuobjdump failed, or the
    library holds only PTX (its kernels are compiled when it is loaded)."""
    tool = cuobjdump()
    if tool is None:
        return None
    try:
        listing = subprocess.run([tool, "-symbols", str(library)], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if "does not contain device code" in listing.stderr:
        return []
    if listing.returncode != 0 or "Fatbin elf code" not in listing.stdout:
        return None
    return list(dict.fromkeys(KERNEL_ENTRY.findall(listing.stdout)))


def kernels_in_library(library: str | Path) -> list[str] | None:
    """The base names of the kernels compiled into `library`, as static_rules.kernel_names gives those of a source
    (a template's instantiations are one name); None where the library cannot be read, and the source must do."""
    symbols = kernel_symbols(library)
    return None if symbols is None else sorted({base_name(symbol)[1] for symbol in symbols})
