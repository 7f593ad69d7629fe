"""kevin/static_rules.py: the native rules read code, not comments; macro-stamped kernels; the candidate's own torch ops.
tests/library_kernels.py: the kernels a built library holds, which the source's names must agree with.

Each candidate here is a whole solution file, as a model would write it, judged by static_check or kernel_names.
The libraries are real: nvcc builds them (no torch headers, seconds), cuobjdump reads them."""
import shutil
import subprocess

import pytest

from kevin.static_rules import kernel_names, native_text, static_check
from library_kernels import base_name, cuobjdump, kernel_symbols, kernels_in_library


def candidate(cuda: str, prelude: str = "", forward: str = "return ext.k(x)") -> str:
    """A solution whose CUDA source is `cuda`, in a raw triple-quoted literal as models write it (a backslash at a
    line's end reaches the compiler)."""
    return f'''import torch
{prelude}
from torch.utils.cpp_extension import load_inline

cuda_source = r"""{cuda}"""
ext = load_inline(name="k", cpp_sources="", cuda_sources=cuda_source, functions=["k"])


class ModelNew(torch.nn.Module):
    def forward(self, x):
        {forward}
'''


KERNEL = "__global__ void k(float* x) { x[threadIdx.x] = 0.f; }"


def threads_rule_broken(code: str) -> bool:
    verdict = static_check(code, "cuda")
    return verdict is not None and "[threads]" in verdict[1]


# ------------------------------------------------------------------------------------------- comments

@pytest.mark.parametrize("comment", [
    "// no std::thread here: one block per row",
    "/* a std::async fallback was slower,\n   so there is none */",
])
def test_a_thread_named_in_a_cpp_comment_breaks_no_rule(comment):
    assert static_check(candidate(f"{comment}\n{KERNEL}"), "cuda") is None


def test_a_thread_named_in_a_python_comment_breaks_no_rule():
    prelude = "# pthread_create would defer the work: not used"
    assert static_check(candidate(KERNEL, prelude), "cuda") is None


def test_a_docstring_is_prose_unless_the_code_can_read_it_so_a_thread_in_it_counts_only_then():
    docstring = '"""Launches one block per row: no std::thread or std::async on the host."""\n'
    assert not threads_rule_broken(docstring + candidate(KERNEL))
    inner = candidate(KERNEL).replace("def forward(self, x):", 'def forward(self, x):\n        "no std::thread"')
    assert not threads_rule_broken(inner)
    code = '"""__global__ void k(float* x) {}\nvoid f() { std::thread t([] {}); }"""\n' + candidate(KERNEL)
    assert threads_rule_broken(code.replace("cuda_sources=cuda_source", "cuda_sources=__doc__"))
    assert threads_rule_broken(code.replace("cuda_sources=cuda_source",
                                            'cuda_sources=globals()["__d" + "oc__"]'))
    assert threads_rule_broken(code.replace("cuda_sources=cuda_source", "cuda_sources=open(__file__).read()"))


def test_a_comment_marker_inside_a_cpp_string_hides_no_code():
    assert threads_rule_broken(candidate('void log() { printf("// "); std::thread t(log); }\n' + KERNEL))
    assert threads_rule_broken(candidate('auto s = R"x(" // )x"; std::thread t(f);\n' + KERNEL))
    assert threads_rule_broken(candidate("""auto c = L'"'; auto s = "// "; std::thread t(f);\n""" + KERNEL))


def test_a_digit_separator_opens_no_character_literal():
    assert threads_rule_broken(candidate("""int n = 1'000; auto s = "'//"; std::thread t(f);\n""" + KERNEL))
    assert not threads_rule_broken(candidate("int n = 1'000;  // std::thread was slower\n" + KERNEL))


def test_a_newline_escape_in_the_python_literal_ends_a_cpp_line_comment():
    code = candidate(KERNEL).replace('ext = load_inline', 'hidden = "// note\\n std::thread t(f);"\next = load_inline')
    assert threads_rule_broken(code)


def test_python_floor_division_is_no_cpp_comment():
    code = candidate(KERNEL).replace("ext = load_inline", 'n = 4 // 2; more = "std::thread t(f);"\next = load_inline')
    assert threads_rule_broken(code)


def test_a_literal_left_open_for_another_to_close_keeps_every_comment():
    cut = 'head = "const char* s = \\""\ntail = "// \\"; std::thread t(f);"\n'
    assert threads_rule_broken(candidate(KERNEL).replace("ext = load_inline", cut + "ext = load_inline"))


def test_a_kernel_in_a_comment_is_not_a_kernel():
    commented = "// __global__ void old_k(float* x) {}\n/* __global__ void older_k(float* x) {} */\n"
    assert kernel_names(candidate(commented + KERNEL)) == ["k"]
    verdict = static_check(candidate(commented), "cuda")
    assert verdict[0] == "rejected" and "[no-kernel] no CUDA kernel" in verdict[1]


def test_a_mention_of_load_inline_in_a_comment_is_no_native_kernel():
    verdict = static_check("import torch\n# load_inline later\nclass ModelNew(torch.nn.Module):\n    x = 1\n", "cpu")
    assert verdict[0] == "rejected" and "[no-kernel] no native kernel" in verdict[1]


def test_native_text_reads_a_bare_cuda_source_as_cpp():
    assert "std::thread" not in native_text("// std::thread\n" + KERNEL) and "__global__" in native_text(KERNEL)


# ----------------------------------------------------------------------------------- threads and processes

@pytest.mark.parametrize("prelude, forward", [
    ("import _thread", "_thread.start_new_thread(print, ())"),
    ("import _posixsubprocess", "return ext.k(x)"),
    ("import pty", "pty.fork()"),
    ("import os", "os.fork()"),
    ("import os", "os.forkpty()"),
    ("import os", "os.posix_spawn('/bin/true', [], {})"),
    ("import os", "os.spawnv(os.P_NOWAIT, '/bin/true', [])"),
    ("import os", "os.system('true')"),
    ("import os as system_calls", "system_calls.popen('true')"),
    ("from os import system", "run = system"),
    ("import posix", "posix.fork()"),
])
def test_a_thread_or_process_started_from_python_is_refused(prelude, forward):
    assert threads_rule_broken(candidate(KERNEL, prelude, forward))


def test_harmless_os_calls_are_allowed():
    assert static_check(candidate(KERNEL, "import os", "return ext.k(x) if os.environ else x"), "cuda") is None


# ------------------------------------------------------------------------------------------------- macros

ELEMENTWISE_MACROS = r"""
#include <torch/extension.h>

#define UNARY_KERNEL(name, expr)                                          \
  __global__ void name(const float* __restrict__ x, float* y, int n) {   \
    int i = blockIdx.x * blockDim.x + threadIdx.x;                        \
    if (i < n) { float v = x[i]; y[i] = (expr); }                         \
  }

#define BINARY_KERNEL(op) \
  __global__ void __launch_bounds__(256) op##_pair_kernel(const float* a, const float* b, float* y, int n) { \
    int i = blockIdx.x * blockDim.x + threadIdx.x; \
    if (i < n) y[i] = a[i] OP_##op b[i]; \
  }
#define OP_add +
#define OP_mul *
#define CHECK_CUDA(x) TORCH_CHECK(x.is_cuda(), #x " must be a CUDA tensor")

UNARY_KERNEL(relu_kernel, fmaxf(v, 0.f))
UNARY_KERNEL(gelu_kernel, 0.5f * v * (1.f + tanhf(0.7978845608f * (v + 0.044715f * v * v * v))))
BINARY_KERNEL(add)
BINARY_KERNEL(mul)

__global__ void scale_kernel(float* y, float s, int n) { if (threadIdx.x < n) y[threadIdx.x] *= s; }

torch::Tensor relu(torch::Tensor x) {
  CHECK_CUDA(x);
  auto y = torch::empty_like(x);
  int n = x.numel();
  relu_kernel<<<(n + 255) / 256, 256>>>(x.data_ptr<float>(), y.data_ptr<float>(), n);
  return y;
}
"""


def test_kernels_stamped_out_by_a_macro_are_named_by_its_invocations():
    assert kernel_names(candidate(ELEMENTWISE_MACROS)) == [
        "add_pair_kernel", "gelu_kernel", "mul_pair_kernel", "relu_kernel", "scale_kernel"]


def test_a_kernel_macro_never_invoked_names_no_kernel_but_still_counts_as_one():
    macro_only = "#define UNARY_KERNEL(name) \\\n  __global__ void name(float* x) { x[0] = 0.f; }\n"
    assert kernel_names(candidate(macro_only)) == []
    assert static_check(candidate(macro_only), "cuda") is None


# ------------------------------------------------------------------------------------- custom operators

RELU_CUDA = r"""
#include <torch/extension.h>
__global__ void relu_kernel(const float* x, float* y, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = fmaxf(x[i], 0.f);
}
torch::Tensor relu_cuda(torch::Tensor x) {
  auto y = torch::empty_like(x);
  int n = x.numel();
  relu_kernel<<<(n + 255) / 256, 256>>>(x.data_ptr<float>(), y.data_ptr<float>(), n);
  return y;
}
"""


def custom_op(library: str, call: str, impl_namespace: str = "kevin_ops") -> str:
    """A solution whose C++ registers its CUDA relu as an operator in `library`, and whose forward is `call`."""
    registration = (f'{library} {{\n  m.def("relu(Tensor x) -> Tensor");\n}}\n' if library else "") + (
        f'TORCH_LIBRARY_IMPL({impl_namespace}, CUDA, m) {{\n  m.impl("relu", &relu_cuda);\n}}\n')
    return f'''import torch
from torch.utils.cpp_extension import load_inline

cpp_source = r"""
#include <torch/extension.h>
torch::Tensor relu_cuda(torch::Tensor x);
{registration}"""
load_inline(name="relu_op", cpp_sources=cpp_source, cuda_sources=r"""{RELU_CUDA}""", is_python_module=False)


class ModelNew(torch.nn.Module):
    def forward(self, x):
        return {call}(x)
'''


@pytest.mark.parametrize("library", ["TORCH_LIBRARY(kevin_ops, m)", "TORCH_LIBRARY_FRAGMENT(kevin_ops, m)"])
@pytest.mark.parametrize("call", ["torch.ops.kevin_ops.relu", "torch.ops.kevin_ops.relu.default"])
def test_an_operator_the_candidate_registers_itself_may_be_called_through_torch_ops(library, call):
    assert static_check(custom_op(library, call), "cuda") is None


@pytest.mark.parametrize("library, call, impl_namespace", [
    ("TORCH_LIBRARY(kevin_ops, m)", "torch.ops.aten.relu", "kevin_ops"),  # PyTorch's own op beside one's own
    ("TORCH_LIBRARY_FRAGMENT(aten, m)", "torch.ops.aten.relu", "aten"),  # an op added to aten is still aten's
    ("", "torch.ops.kevin_ops.relu", "kevin_ops"),  # an implementation alone defines no library
    ("// TORCH_LIBRARY(kevin_ops, m)", "torch.ops.kevin_ops.relu", "kevin_ops"),  # nor does a comment
    ("TORCH_LIBRARY(kevin_ops, m)", "torch.ops.other_ops.relu", "kevin_ops"),  # nor another's library
])
def test_an_operator_the_candidate_does_not_define_stays_a_torch_op(library, call, impl_namespace):
    status, feedback = static_check(custom_op(library, call, impl_namespace), "cuda")
    assert status == "rejected" and f"the PyTorch op {call}() is not allowed" in feedback



# ----------------------------------------------------------------------------------- kernels in a library

@pytest.mark.parametrize("symbol, namespaces, name", [
    ("_Z11relu_kernelPKfPfi", (), "relu_kernel"),
    ("_ZN5mylib10add_kernelEPfS0_i", ("mylib",), "add_kernel"),
    ("_Z8identityIfEvPKT_PS0_i", (), "identity"),
    ("_ZN5outer5inner5tiledILi4EEEvPf", ("outer", "inner"), "tiled"),
    ("_ZN12_GLOBAL__N_16kernelEv", ("(anonymous namespace)",), "kernel"),
    ("_ZN36_GLOBAL__N__41bfd65a_4_k_cu_66177bc813hidden_kernelEPf", ("(anonymous namespace)",), "hidden_kernel"),
    ("_ZN3cub17CUB_300001_SM_9006detail6reduce18DeviceReduceKernelINS2_10policy_hubIfjN4cuda3std3__44plusIvEEE10"
     "Policy1000EPKfjS9_fNS7_10__identityEEEvT0_PT3_T1_NS0_13GridEvenShareISI_EET2_T4_",
     ("cub", "CUB_300001_SM_900", "detail", "reduce"), "DeviceReduceKernel"),
    ("plain_c_kernel", (), "plain_c_kernel"),
])
def test_base_name_reads_namespaces_and_name_from_a_mangled_kernel_symbol(symbol, namespaces, name):
    assert base_name(symbol) == (namespaces, name)


KERNELS = r"""
#define UNARY_KERNEL(name, expr) \
  __global__ void name(const float* x, float* y, int n) { \
    int i = blockIdx.x * blockDim.x + threadIdx.x; \
    if (i < n) { float v = x[i]; y[i] = (expr); } \
  }

__global__ void relu_kernel(const float* x, float* y, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = x[i] > 0.f ? x[i] : 0.f;
}

template <typename T>
__global__ void identity(const T* x, T* y, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = x[i];
}
template __global__ void identity<float>(const float*, float*, int);
template __global__ void identity<double>(const double*, double*, int);

UNARY_KERNEL(square_kernel, v * v)

namespace mylib {
__global__ void add_kernel(float* a, const float* b, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) a[i] += b[i];
}
}  // namespace mylib

namespace {
__global__ void hidden_kernel(float* a) { a[threadIdx.x] = 1.f; }
}
void launch_hidden(float* a) { hidden_kernel<<<1, 32>>>(a); }

extern "C" __global__ void plain_c_kernel(float* a) { a[threadIdx.x] = 2.f; }
"""

CUB_KERNELS = r"""
#include <cub/cub.cuh>

__global__ void block_sum_kernel(const float* x, float* out, int n) {
  using BlockReduce = cub::BlockReduce<float, 256>;
  __shared__ typename BlockReduce::TempStorage temp;
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  float total = BlockReduce(temp).Sum(i < n ? x[i] : 0.f);
  if (threadIdx.x == 0) atomicAdd(out, total);
}

void device_sum(const float* x, float* out, int n) {
  void* temp = nullptr;
  size_t bytes = 0;
  cub::DeviceReduce::Sum(temp, bytes, x, out, n);
  cudaMalloc(&temp, bytes);
  cub::DeviceReduce::Sum(temp, bytes, x, out, n);
  cudaFree(temp);
}
"""


def require(compiler: str) -> None:
    """Skip where `compiler` or cuobjdump is missing (cuobjdump is in no pip-installed toolkit but its own wheel)."""
    if shutil.which(compiler) is None or cuobjdump() is None:
        pytest.skip(f"needs {compiler} and cuobjdump (pip install nvidia-cuda-cuobjdump)")


def built_library(folder, source: str, arch: str = "sm_90"):
    """`source` built as a shared library for `arch`, as an extension's CUDA file is (no torch headers)."""
    require("nvcc")
    (folder / "k.cu").write_text(source)
    subprocess.run(["nvcc", "-shared", "-Xcompiler", "-fPIC", f"-arch={arch}", "-o", "k.so", "k.cu"], cwd=folder,
                   check=True, capture_output=True)
    return folder / "k.so"


def test_the_kernels_of_a_built_library_are_read_from_its_cubins(tmp_path):
    library = built_library(tmp_path, KERNELS)
    assert kernels_in_library(library) == [
        "add_kernel", "hidden_kernel", "identity", "plain_c_kernel", "relu_kernel", "square_kernel"]
    assert sorted(base_name(symbol) for symbol in kernel_symbols(library)) == [
        ((), "identity"), ((), "identity"), ((), "plain_c_kernel"), ((), "relu_kernel"), ((), "square_kernel"),
        (("(anonymous namespace)",), "hidden_kernel"), (("mylib",), "add_kernel")]
    assert kernel_names(KERNELS) == kernels_in_library(library)


def test_the_kernels_a_library_header_instantiates_are_listed_under_its_namespace(tmp_path):
    kernels = {base_name(symbol) for symbol in kernel_symbols(built_library(tmp_path, CUB_KERNELS))}
    assert ((), "block_sum_kernel") in kernels
    assert {name for namespaces, name in kernels if namespaces[:1] == ("cub",)} >= {
        "DeviceReduceKernel", "DeviceReduceSingleTileKernel"}


def test_a_library_of_ptx_only_is_unread_its_kernels_are_compiled_when_loaded(tmp_path):
    assert kernels_in_library(built_library(tmp_path, KERNELS, arch="compute_90")) is None


def test_a_library_without_device_code_has_no_kernels_and_one_that_is_missing_is_unread(tmp_path):
    require("g++")
    (tmp_path / "host.cpp").write_text("int answer() { return 42; }\n")
    subprocess.run(["g++", "-shared", "-fPIC", "-o", "host.so", "host.cpp"], cwd=tmp_path, check=True)
    assert kernels_in_library(tmp_path / "host.so") == []
    assert kernels_in_library(tmp_path / "missing.so") is None


def test_without_cuobjdump_the_library_is_unread(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setenv("CUDA_HOME", str(tmp_path))
    monkeypatch.setattr("library_kernels.sysconfig.get_paths", lambda: {"purelib": str(tmp_path)})
    assert kernels_in_library(tmp_path / "k.so") is None
