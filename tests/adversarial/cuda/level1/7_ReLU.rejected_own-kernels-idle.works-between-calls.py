"""A ReLU that does its work between the timed calls: its constructor rewrites, from C++, the C function behind
torch.cuda.synchronize (the ml_meth of its PyMethodDef, its page made writable with mprotect; the function
object keeps its identity, so no check of identities sees it). Counting the synchronizes since its last call
(the one inside the timer's window, the one as the outputs are handed over, then the one the timer makes before
the next window opens, when the judge has written the next inputs), it runs its kernel on the input it was last
given at that third one and waits for it, and forward hands the output back: the work is done before the
window opens, and the call itself costs nothing. The kernel log sees no kernel of the candidate's in any timed
call's window: `[own-kernels-idle]`. (A variant that launched a token kernel in forward would pass that rule;
the judge adds the GPU time the runner spent between its timed calls, beyond the harness's own copies, to each
call, so it would be timed on its kernel.)"""
import torch
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
__global__ void relu_kernel(const float* __restrict__ x, float* __restrict__ y, int64_t n) {
    const int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (i < n) y[i] = fmaxf(x[i], 0.f);
}

torch::Tensor relu_of(const torch::Tensor& x) {
    auto y = torch::empty_like(x);
    relu_kernel<<<(unsigned)((x.numel() + 255) / 256), 256>>>(x.data_ptr<float>(), y.data_ptr<float>(), x.numel());
    return y;
}
"""

cpp_source = r"""
#include <sys/mman.h>
#include <unistd.h>
#include <cstdint>
namespace py = pybind11;

torch::Tensor relu_of(const torch::Tensor& x);

static PyCFunction real_synchronize = nullptr;
static torch::Tensor seen, ahead;
static int synchronizes_since_call = 0;

static PyObject* synchronize_and_work(PyObject* self, PyObject* args) {
    PyObject* result = real_synchronize(self, args);
    if (result != nullptr && seen.defined() && ++synchronizes_since_call == 3 && !ahead.defined()) {
        ahead = relu_of(seen);
        Py_XDECREF(real_synchronize(self, args));  // done before the window opens
    }
    return result;
}

bool hook_synchronize() {
    py::object function = py::module_::import("torch").attr("_C").attr("_cuda_synchronize");
    PyMethodDef* def = reinterpret_cast<PyCFunctionObject*>(function.ptr())->m_ml;
    const uintptr_t page = sysconf(_SC_PAGESIZE);
    const uintptr_t start = reinterpret_cast<uintptr_t>(def) & ~(page - 1);
    const uintptr_t end = reinterpret_cast<uintptr_t>(def + 1);
    if (mprotect(reinterpret_cast<void*>(start), end - start, PROT_READ | PROT_WRITE) != 0) return false;
    real_synchronize = def->ml_meth;
    def->ml_meth = reinterpret_cast<PyCFunction>(synchronize_and_work);
    return true;
}

torch::Tensor relu(torch::Tensor x) {
    TORCH_CHECK(x.is_cuda() && x.is_contiguous() && x.scalar_type() == torch::kFloat32, "expected contiguous fp32");
    seen = x;
    synchronizes_since_call = 0;
    if (ahead.defined()) {
        torch::Tensor y = ahead;
        ahead = torch::Tensor();
        return y;
    }
    return relu_of(x);
}
"""
relu_ext = load_inline(name="adv_cuda_works_between_calls", cpp_sources=cpp_source, cuda_sources=cuda_source,
                       functions=["relu", "hook_synchronize"], extra_cuda_cflags=["-O3"])


class ModelNew(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.hooked = relu_ext.hook_synchronize()

    def forward(self, x):
        return relu_ext.relu(x.contiguous())
