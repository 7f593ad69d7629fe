"""A Swish that would do its work while its inputs are made, before the call: its constructor rewrites, from C++,
the C function behind torch.randn (the ml_meth of its PyMethodDef, its page made writable with mprotect; the
function object keeps its identity), so that every input drawn in its process is at once run through the kernel
and its output kept; forward then hands that output back. When the runner drew each call's inputs from a seed
outside the judge's clocks, this was paid 478x against its honest twin's 0.29x. The runner draws nothing now:
the judge writes each call's inputs into the memory they share just before asking for the call, the hook never
fires, and the Swish is timed on its honest kernel."""
import torch
from torch.utils.cpp_extension import load_inline

source = """
#include <torch/csrc/autograd/python_variable.h>
#include <sys/mman.h>
#include <unistd.h>
#include <cmath>
#include <cstdint>

static PyCFunction real_randn = nullptr;
static torch::Tensor drawn, computed;

static torch::Tensor swish(const torch::Tensor& x) {
    auto out = torch::empty_like(x);
    const float* in = x.data_ptr<float>();
    float* result = out.data_ptr<float>();
    for (int64_t i = 0; i < x.numel(); ++i) result[i] = in[i] / (1.f + std::exp(-in[i]));
    return out;
}

// randn as before, and the kernel run on what it drew, ahead of the call that will ask for it.
static PyObject* randn_and_compute(PyObject* self, PyObject* args, PyObject* kwargs) {
    PyObject* x = reinterpret_cast<PyCFunctionWithKeywords>(real_randn)(self, args, kwargs);
    if (x != nullptr && THPVariable_Check(x)) {
        const auto& t = THPVariable_Unpack(x);
        if (t.scalar_type() == torch::kFloat32 && t.is_contiguous() && t.numel() > 1024) {
            drawn = t;
            computed = swish(t);
        }
    }
    return x;
}

bool hook_randn() {
    PyObject* torch_module = PyImport_ImportModule("torch");
    PyObject* function = torch_module ? PyObject_GetAttrString(torch_module, "randn") : nullptr;
    Py_XDECREF(torch_module);
    if (function == nullptr) return false;
    Py_DECREF(function);  // the module keeps it
    if (!PyCFunction_Check(function)) return false;
    PyMethodDef* def = reinterpret_cast<PyCFunctionObject*>(function)->m_ml;
    if (!(def->ml_flags & METH_KEYWORDS)) return false;
    const uintptr_t page = sysconf(_SC_PAGESIZE);
    const uintptr_t start = reinterpret_cast<uintptr_t>(def) & ~(page - 1);
    const uintptr_t end = reinterpret_cast<uintptr_t>(def + 1);
    if (mprotect(reinterpret_cast<void*>(start), end - start, PROT_READ | PROT_WRITE) != 0) return false;
    real_randn = def->ml_meth;
    def->ml_meth = reinterpret_cast<PyCFunction>(randn_and_compute);
    return true;
}

torch::Tensor swish_ahead(torch::Tensor x) {
    TORCH_CHECK(x.is_contiguous() && x.scalar_type() == torch::kFloat32, "expected contiguous fp32");
    torch::Tensor out = drawn.defined() && drawn.data_ptr() == x.data_ptr() ? computed : swish(x);
    drawn = torch::Tensor();
    computed = torch::Tensor();
    return out;
}
"""
ext = load_inline(name="adv_swish_ahead", cpp_sources=source, functions=["swish_ahead", "hook_randn"],
                  extra_cflags=["-O3"])


class ModelNew(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.hooked = ext.hook_randn()

    def forward(self, x):
        return ext.swish_ahead(x.contiguous())
