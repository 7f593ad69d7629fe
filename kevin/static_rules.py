"""The candidate's source, read without running it: the code block of a reply, and the static rules.

Cheap and done first, so that a reply with no code, or code that breaks a rule (try/except, `pass`, torch.nn
layers or functional, torch compute ops, threads, introspection, subclassing the reference, no native
kernel), costs no build. Two profiles: the paper's (kevin) and KernelBench's, which allows PyTorch ops and
torch.nn layers. `kernel_names` also tells the profiler which kernels are the candidate's own.
"""
from __future__ import annotations

import ast
import re
from dataclasses import dataclass

@dataclass(frozen=True)
class RuleProfile:
    """What a rule profile (--rules) decides, in one place: how feedback names it, the tolerance (atol = rtol) per
    output dtype ("other": the rest), whether PyTorch ops and torch.nn layers may do what the candidate's kernels
    do not (then its kernels need only run, and KEVIN_ONLY rules do not apply), and the prompt's line about it."""
    title: str
    tolerance: dict[str, float]
    torch_allowed: bool
    prompt_line: str


RULE_PROFILES = {
    "kevin": RuleProfile(
        "Kevin's rules (the paper's)", {"float32": 1e-2, "float16": 1e-2, "bfloat16": 1e-2, "other": 1e-2}, False,
        "- Do not use torch.nn modules, torch.nn.functional or any other PyTorch operator for the computation. "
        "From torch.nn only Parameter, containers (Module, ModuleList, ParameterList, ...) and init are allowed."),
    # KernelBench's tolerances in its versions after the one Kevin used (1e-2 for all)
    "kernelbench": RuleProfile(
        "KernelBench's rules", {"float32": 1e-4, "float16": 1e-2, "bfloat16": 1e-2, "other": 1e-4}, True,
        "- You may keep PyTorch operators and torch.nn layers for the parts you do not replace, but your "
        "own kernels must do the rest and must run in `forward`."),
}

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
# An operator library the candidate's own C++ defines: torch.ops.<namespace>.<op> then calls its own kernel.
OWN_OP_LIBRARY = re.compile(r"\bTORCH_LIBRARY(?:_FRAGMENT)?\s*\(\s*(\w+)\s*,")
# PyTorch's own operator namespaces: a candidate that adds to one still calls PyTorch's ops through it.
PYTORCH_OP_NAMESPACES = {"aten", "prim", "prims", "quantized", "_quantized", "c10d", "_c10d_functional", "profiler",
                         "rngprims", "higher_order", "inductor", "mkldnn", "torchvision", "_test"}
# module -> the rule that bans it: work outside the timed region, or reaching into the checker's memory.
BANNED_IMPORTS = {"threading": "threads", "multiprocessing": "threads", "concurrent": "threads",
                  "asyncio": "threads", "subprocess": "threads", "_thread": "threads", "_posixsubprocess": "threads",
                  "pty": "threads", "ctypes": "introspection",
                  "gc": "introspection", "inspect": "introspection", "builtins": "introspection",
                  "importlib": "introspection"}
# Attributes that reach frames, globals or other objects' code: the evaluator's locals are one hop away.
INTROSPECTION = {"_getframe", "f_back", "f_locals", "f_globals", "f_code", "tb_frame", "gi_frame", "cr_frame",
                 "__globals__", "__builtins__", "__closure__", "__code__", "__import__"}
# os functions that start a process: as much work outside the timed region as a subprocess.
PROCESS_CALLS = re.compile(r"(os|posix)\.(fork|forkpty|posix_spawnp?|spawn\w*|system|popen)")


NATIVE_THREADS = re.compile(r"std::thread|std::async|std::jthread|pthread_create|cudaLaunchHostFunc|"
                            r"cudaStreamAddCallback")
GLOBAL_FUNCTION = re.compile(r"__global__\s+[\w:<>,\s*&]*?\b(\w+)\s*\(")
# One C/C++ token that matters to comments: a comment (an unclosed /* runs to the end), a raw string, a character
# or string literal, or a quote that opens a literal the text never closes.
C_TOKEN = re.compile(r"(?P<comment>//[^\n]*|/\*.*?(?:\*/|\Z))"
                     r'|(?<!\w)(?:u8|[LuU])?R"(?P<delimiter>[^()\\\s]{0,16})\(.*?\)(?P=delimiter)"'
                     r"|(?<!\w)(?:u8|[LuU])?'(?:\\.|[^'\\\n])*'"
                     r'|"(?:\\.|[^"\\\n])*"'
                     r"|(?P<unclosed>(?<!\w)'|\")", re.DOTALL)  # (?<!\w): 1'000 is a number, don't an apostrophe


def _without_comments(source: str) -> str | None:
    """C/C++ `source`, lines spliced, each comment a space; None where a quote opens a literal that `source` never
    closes: a piece cut from a longer source, in which what reads as a comment may sit inside that literal."""
    unclosed = False

    def blank(token: re.Match) -> str:
        nonlocal unclosed
        unclosed = unclosed or token["unclosed"] is not None
        return " " if token["comment"] else token[0]

    text = C_TOKEN.sub(blank, re.sub(r"\\\r?\n", "", source))
    return None if unclosed else text


# What reaches the value of a string that stands alone as a statement (a docstring): its name, or the routes to a
# name that is spelt out nowhere (a computed attribute, a namespace's dict) or to the file's own text.
READS_PROSE = re.compile(r"__doc__|__file__|__loader__|__spec__|__dict__|getattr|globals|vars|linecache")


def native_text(code: str) -> str:
    """What the native rules read: the value of each string literal of the candidate (its C++/CUDA sources) with
    C/C++ comments removed, and its Python names (a CUDA runtime binding called from Python). Python comments drop
    out, so an honest `// no std::thread here` or `# no std::thread` breaks no rule; so do docstrings and other
    strings that stand alone as statements, unless the code has a way to read them (`READS_PROSE`: then they are
    values it can compile). Values, not spelling: in `"// x\\n std::thread t;"` the thread is code. If any
    literal leaves a quote open, its neighbours may sit inside it, and nothing is removed. Text that is not Python
    is read as one C/C++ source."""
    try:
        tree = ast.parse(code)
    except SyntaxError:
        stripped = _without_comments(code)
        return code if stripped is None else stripped
    prose = set() if READS_PROSE.search(code) else \
        {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant)}
    sources = [n.value for n in ast.walk(tree)
               if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in prose]
    names = [n.id if isinstance(n, ast.Name) else n.attr if isinstance(n, ast.Attribute) else n.name
             for n in ast.walk(tree) if isinstance(n, (ast.Name, ast.Attribute, ast.alias))]
    stripped = [_without_comments(source) for source in sources]
    return "\n".join((sources if None in stripped else stripped) + names)


# A function-like macro's definition, its lines already spliced: name, parameters, body.
MACRO_DEFINITION = re.compile(r"^[ \t]*#[ \t]*define[ \t]+(\w+)\(([^)]*)\)(.*)$", re.MULTILINE)


def _global_functions(source: str) -> list[str]:
    """The __global__ functions `source` defines; `__launch_bounds__(...)` would read as the name."""
    return GLOBAL_FUNCTION.findall(re.sub(r"__launch_bounds__\s*\([^)]*\)", "", source))


def _macro_arguments(source: str, macro: str) -> list[list[str]]:
    """The arguments of each invocation of `macro` in `source`, split at the commas outside parentheses."""
    invocations = []
    for call in re.finditer(rf"\b{macro}\s*\(", source):
        arguments, depth, start = [], 0, call.end()
        for i in range(call.end(), len(source)):
            depth += {"(": 1, ")": -1}.get(source[i], 0)
            if depth < 0 or (depth == 0 and source[i] == ","):
                arguments.append(source[start:i].strip())
                start = i + 1
            if depth < 0:
                invocations.append(arguments)
                break
    return invocations


def kernel_names(code: str) -> list[str]:
    """Names of the __global__ functions a candidate defines: its own kernels, as the profiler names them. A kernel
    stamped out by a function-like macro (`#define UNARY(name, expr) __global__ void name(...)`, then
    `UNARY(relu_kernel, ...)`) is named by each invocation: its arguments put in, `##` pasted."""
    source = native_text(code)
    outside_macros = MACRO_DEFINITION.sub("", source)
    names = set(_global_functions(outside_macros))
    for macro, parameters, body in MACRO_DEFINITION.findall(source):
        if "__global__" not in body:
            continue
        parameters = [p.strip() for p in parameters.split(",")]
        for arguments in _macro_arguments(outside_macros, macro):
            if len(arguments) == len(parameters):
                given = dict(zip(parameters, arguments))
                expanded = re.sub(r"\w+", lambda word: given.get(word[0], word[0]), body)
                names.update(_global_functions(re.sub(r"\s*##\s*", "", expanded)))
    return sorted(names)


def _dotted(node: ast.AST, aliases: dict[str, str]) -> str | None:
    """`nn.functional.relu` -> `torch.nn.functional.relu`, through the module's import aliases."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name) or node.id not in aliases:
        return None
    return ".".join([aliases[node.id], *reversed(parts)])


def rejection(rules: str, reasons: list[str]) -> str:
    """The feedback of a rejection: the rules that judged, then each rule broken."""
    return f"Rejected by {RULE_PROFILES[rules].title}:\n" + "\n".join(f"- {r}" for r in reasons)


# Rules that only the paper's profile has: KernelBench lets PyTorch do what the candidate's kernels do not.
KEVIN_ONLY = ("[torch-op]", "[torch-functional]", "[torch-nn-layer]")


@dataclass
class Source:
    """A candidate as the rules read it: its syntax tree, what each name its imports bind stands for (`F` ->
    `torch.nn.functional`), its native text (`native_text`), and the operator namespaces its own C++ defines."""
    tree: ast.Module
    aliases: dict[str, str]
    native: str
    own_ops: tuple[str, ...]

    @classmethod
    def read(cls, tree: ast.Module, code: str) -> Source:
        aliases = {"torch": "torch"}
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for a in node.names:
                    aliases[(a.asname or a.name).split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
            elif isinstance(node, ast.ImportFrom) and node.module:
                for a in node.names:
                    aliases[a.asname or a.name] = f"{node.module}.{a.name}"
        native = native_text(code)
        own_ops = tuple(f"torch.ops.{namespace}." for namespace in set(OWN_OP_LIBRARY.findall(native))
                        - PYTORCH_OP_NAMESPACES)
        return cls(tree, aliases, native, own_ops)

    def nodes(self, *types):
        return (node for node in ast.walk(self.tree) if isinstance(node, types))

    def names(self):
        """(node, its dotted name through the import aliases, or None) of every name and attribute."""
        return ((node, _dotted(node, self.aliases)) for node in self.nodes(ast.Attribute, ast.Name))


def check_imports(source: Source, device: str) -> list[str]:
    """torch.nn.functional, and the modules that run work outside the timed call or reach into the checker."""
    found = []
    for node in source.nodes(ast.Import, ast.ImportFrom):
        modules = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
        for module in modules:
            if module.startswith("torch.nn.functional") or (isinstance(node, ast.ImportFrom) and module == "torch.nn"
                                                            and any(a.name == "functional" for a in node.names)):
                found.append("[torch-functional] imports torch.nn.functional")
            if module.split(".")[0] in BANNED_IMPORTS:
                found.append(f"[{BANNED_IMPORTS[module.split('.')[0]]}] line {node.lineno}: importing {module} is not "
                             "allowed")
    return found


def check_fallbacks(source: Source, device: str) -> list[str]:
    """try/except (a fallback path) and `pass` (a body that does nothing)."""
    return [f"[try-except] line {node.lineno}: try/except is not allowed (no fallback paths)"
            for node in source.nodes(ast.Try, getattr(ast, "TryStar", ast.Try))] + \
        [f"[pass] line {node.lineno}: `pass` is not allowed" for node in source.nodes(ast.Pass)]


def check_introspection(source: Source, device: str) -> list[str]:
    """Frames, globals, code objects: the evaluator's objects one hop away."""
    found = []
    for node, _ in source.names():
        name = node.attr if isinstance(node, ast.Attribute) else node.id
        if name in INTROSPECTION:
            found.append(f"[introspection] line {node.lineno}: {name} is not allowed")
    return found


def check_threads_and_processes(source: Source, device: str) -> list[str]:
    """A banned module reached as an attribute (torch.cuda.threading), os calls that start a process, and native
    code that starts threads or host callbacks."""
    found = []
    for node, name in source.names():
        if name and isinstance(node, ast.Attribute) and node.attr in BANNED_IMPORTS:
            found.append(f"[{BANNED_IMPORTS[node.attr]}] line {node.lineno}: {name} is not allowed")
        if name and PROCESS_CALLS.fullmatch(name):
            found.append(f"[threads] line {node.lineno}: {name} starts a process and is not allowed")
    if NATIVE_THREADS.search(source.native):
        found.append("[threads] native code must not start threads or host callbacks (std::thread, "
                     "pthread_create, std::async, cudaLaunchHostFunc)")
    return found


def check_torch_nn(source: Source, device: str) -> list[str]:
    """torch.nn.functional and torch.nn layers: only the module system, parameters, containers and init."""
    found = []
    for node, name in source.names():
        if name and name.startswith("torch.nn.") and not name.startswith("torch.nn.init"):
            member = name.split(".")[2]
            if member == "functional":
                found.append(f"[torch-functional] line {node.lineno}: {name} is not allowed")
            elif member not in ALLOWED_NN and member[:1].isupper():
                found.append(f"[torch-nn-layer] line {node.lineno}: torch.nn.{member} is not allowed "
                             "(only Module, Parameter, containers and init)")
    return found


def check_torch_ops(source: Source, device: str) -> list[str]:
    """PyTorch compute ops: allocation, random init, torch.cuda and the extension builder are allowed, and the
    operators of a library the candidate's own C++ defines."""
    found = []
    for node in source.nodes(ast.Call):
        name = _dotted(node.func, source.aliases)
        if not (name and name.startswith("torch.")):
            continue
        if not (name.startswith((*ALLOWED_TORCH_NAMESPACES, "torch.nn.", *source.own_ops))
                or name.split(".")[1] in ALLOWED_TORCH_CALLS):
            found.append(f"[torch-op] line {node.lineno}: the PyTorch op {name}() is not allowed: "
                         "the work must be done by your own kernel")
    return found


def check_subclass(source: Source, device: str) -> list[str]:
    """ModelNew built on the reference Model would run the reference."""
    model_new = next(n for n in source.nodes(ast.ClassDef) if n.name == "ModelNew")
    bases = {_dotted(b, {**source.aliases, "Model": "Model"}) or "" for b in model_new.bases}
    if "Model" in bases or any(b.endswith(".Model") for b in bases):
        return ["[subclass-reference] ModelNew must not subclass the reference Model"]
    return []


def check_native_kernel(source: Source, device: str) -> list[str]:
    """A native extension built with load_inline, and on a GPU a __global__ kernel in it (in a macro too)."""
    if "load_inline" not in source.native:
        return ["[no-kernel] no native kernel: build one with torch.utils.cpp_extension.load_inline"]
    if device == "cuda" and not _global_functions(source.native):
        return ["[no-kernel] no CUDA kernel: cuda_sources must define a __global__ kernel"]
    return []


CHECKS = (check_imports, check_fallbacks, check_introspection, check_threads_and_processes, check_torch_nn,
          check_torch_ops, check_subclass, check_native_kernel)


def static_check(code: str, device: str, rules: str = "kevin") -> tuple[str, str] | None:
    """(status, feedback) if the source breaks a rule of `rules` (kevin or kernelbench), else None. Cheap: no
    import, no build."""
    try:
        tree = ast.parse(code)
    except SyntaxError as e:
        return "compile_error", f"Python syntax error on line {e.lineno}: {e.msg}"
    if not any(n.name == "ModelNew" for n in ast.walk(tree) if isinstance(n, ast.ClassDef)):
        return "format_error", "The code defines no `class ModelNew(torch.nn.Module)`."
    source = Source.read(tree, code)
    violations = [v for check in CHECKS for v in check(source, device)]
    if RULE_PROFILES[rules].torch_allowed:
        violations = [v for v in violations if not v.startswith(KEVIN_ONLY)]
    if violations:
        return "rejected", rejection(rules, list(dict.fromkeys(violations))[:10])
    return None
