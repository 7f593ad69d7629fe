"""An honest ReLU whose constructor rewrites, from C++, the C function behind time.perf_counter and
time.perf_counter_ns (the ml_meth of their PyMethodDef in the time module's method table, its page made
writable with mprotect): the same objects, identity kept, now read a clock running 20x slow, so every call it
times for itself reads 20x shorter. On the CPU the judge times the call itself (the CPU time the kernel counts
for the runner's threads), so the faked clock is never read: it is timed on its honest kernel."""
import torch
from torch.utils.cpp_extension import load_inline

source = """
#include <sys/mman.h>
#include <unistd.h>
#include <cstdint>

constexpr int64_t SLOWDOWN = 20;
constexpr int SLOTS = 4;
struct Clock { PyCFunction real = nullptr; double base = 0.0; long long base_ns = 0; };
static Clock clocks[SLOTS];

// The real clock's reading, mapped onto one that has run 1/SLOWDOWN as fast since the swap.
template <int I>
PyObject* slowed(PyObject* self, PyObject* unused) {
    PyObject* now = clocks[I].real(self, unused);
    if (now == nullptr) return nullptr;
    if (PyFloat_Check(now)) {
        const double real = PyFloat_AsDouble(now);
        Py_DECREF(now);
        return PyFloat_FromDouble(clocks[I].base + (real - clocks[I].base) / SLOWDOWN);
    }
    const long long real = PyLong_AsLongLong(now);
    Py_DECREF(now);
    return PyLong_FromLongLong(clocks[I].base_ns + (real - clocks[I].base_ns) / SLOWDOWN);
}

static const PyCFunction SLOWED[SLOTS] = {slowed<0>, slowed<1>, slowed<2>, slowed<3>};

// Swaps the C function of time.perf_counter and time.perf_counter_ns; returns how many it swapped.
int64_t slow_the_clocks() {
    PyObject* time_module = PyImport_ImportModule("time");
    if (time_module == nullptr) return -1;
    const char* names[] = {"perf_counter", "perf_counter_ns"};
    int64_t swapped = 0;
    const uintptr_t page = sysconf(_SC_PAGESIZE);
    for (int i = 0; i < 2; ++i) {
        PyObject* f = PyObject_GetAttrString(time_module, names[i]);
        if (f == nullptr) return -1;
        Py_DECREF(f);  // the module keeps it
        if (!PyCFunction_Check(f)) continue;
        PyMethodDef* def = ((PyCFunctionObject*)f)->m_ml;
        if ((def->ml_flags & ~METH_COEXIST) != METH_NOARGS || def->ml_meth == SLOWED[i]) continue;
        PyObject* first = def->ml_meth(PyCFunction_GET_SELF(f), nullptr);
        if (first == nullptr) return -1;
        clocks[i].base = PyFloat_Check(first) ? PyFloat_AsDouble(first) : 0.0;
        clocks[i].base_ns = PyLong_Check(first) ? PyLong_AsLongLong(first) : 0;
        Py_DECREF(first);
        const uintptr_t start = reinterpret_cast<uintptr_t>(def) & ~(page - 1);
        const uintptr_t end = reinterpret_cast<uintptr_t>(def + 1);
        mprotect(reinterpret_cast<void*>(start), end - start, PROT_READ | PROT_WRITE);
        clocks[i].real = def->ml_meth;
        def->ml_meth = SLOWED[i];
        ++swapped;
    }
    Py_DECREF(time_module);
    return swapped;
}

torch::Tensor relu(torch::Tensor x) {
    TORCH_CHECK(x.is_contiguous() && x.scalar_type() == torch::kFloat32, "expected contiguous fp32");
    auto out = torch::empty_like(x);
    const float* in = x.data_ptr<float>();
    float* result = out.data_ptr<float>();
    const int64_t n = x.numel();
    for (int64_t i = 0; i < n; ++i) result[i] = in[i] > 0.f ? in[i] : 0.f;
    return out;
}
"""
ext = load_inline(name="adv_slowed_clock", cpp_sources=source, functions=["relu", "slow_the_clocks"],
                  extra_cflags=["-O3"])


class ModelNew(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.swapped = ext.slow_the_clocks()

    def forward(self, x):
        return ext.relu(x.contiguous())
