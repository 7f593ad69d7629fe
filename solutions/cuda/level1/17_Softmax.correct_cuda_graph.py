"""Softmax as a CUDA graph of two kernels (row max and sum, then normalise), re-pointed at each call's tensors."""
import torch
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
#include <cfloat>

constexpr int THREADS = 256;

// (max, sum of exp(v - max)) pairs: merging two keeps the sum relative to the larger max.
struct MaxSum {
    float m, s;
};

__device__ __forceinline__ MaxSum merge(MaxSum a, MaxSum b) {
    const float m = fmaxf(a.m, b.m);
    if (m == -INFINITY) return {m, 0.f};
    return {m, a.s * expf(a.m - m) + b.s * expf(b.m - m)};
}

// Kernel 1: one block per row, an online max and sum over the row, merged across the block.
__global__ void row_stats_kernel(const float4* __restrict__ x, float2* __restrict__ stats, int vecs_per_row) {
    const float4* row = x + (int64_t)blockIdx.x * vecs_per_row;
    MaxSum acc{-INFINITY, 0.f};
    for (int c = threadIdx.x; c < vecs_per_row; c += THREADS) {
        const float4 v = row[c];
        const float m = fmaxf(fmaxf(v.x, v.y), fmaxf(v.z, v.w));
        const MaxSum part{m, expf(v.x - m) + expf(v.y - m) + expf(v.z - m) + expf(v.w - m)};
        acc = merge(acc, part);
    }
    for (int offset = 16; offset > 0; offset >>= 1) {
        const MaxSum other{__shfl_xor_sync(0xffffffff, acc.m, offset), __shfl_xor_sync(0xffffffff, acc.s, offset)};
        acc = merge(acc, other);
    }
    __shared__ MaxSum warps[THREADS / 32];
    if ((threadIdx.x & 31) == 0) warps[threadIdx.x >> 5] = acc;
    __syncthreads();
    if (threadIdx.x == 0) {
        MaxSum total = warps[0];
        for (int w = 1; w < THREADS / 32; ++w) total = merge(total, warps[w]);
        stats[blockIdx.x] = make_float2(total.m, 1.f / total.s);
    }
}

// Kernel 2: one block per row, exp(v - max) / sum.
__global__ void normalise_kernel(const float4* __restrict__ x, const float2* __restrict__ stats,
                                 float4* __restrict__ y, int vecs_per_row) {
    const float2 st = stats[blockIdx.x];
    const int64_t base = (int64_t)blockIdx.x * vecs_per_row;
    for (int c = threadIdx.x; c < vecs_per_row; c += THREADS) {
        const float4 v = x[base + c];
        y[base + c] = make_float4(expf(v.x - st.x) * st.y, expf(v.y - st.x) * st.y,
                                  expf(v.z - st.x) * st.y, expf(v.w - st.x) * st.y);
    }
}

#define CUDA_OK(call) do { cudaError_t e_ = (call); TORCH_CHECK(e_ == cudaSuccess, #call ": ", cudaGetErrorString(e_)); } while (0)

// The graph, built once per (device, rows, row length): its two kernel nodes, stats before normalise.
// Only the pointers change from call to call, so each call updates the nodes' parameters in the
// instantiated graph and launches it on the caller's stream.
struct SoftmaxGraph {
    int device = -1;
    int64_t rows = -1;
    int vecs = -1;
    cudaGraph_t graph = nullptr;
    cudaGraphExec_t exec = nullptr;
    cudaGraphNode_t stats_node = nullptr, norm_node = nullptr;
    // Argument values the nodes' parameter arrays point at (copied by CUDA when the parameters are set).
    const float4* x = nullptr;
    float2* stats = nullptr;
    float4* y = nullptr;
    int vecs_arg = 0;
    void* stats_args[3];
    void* norm_args[4];

    cudaKernelNodeParams params(void* fn, void** args) const {
        cudaKernelNodeParams p = {};
        p.func = fn;
        p.gridDim = dim3((unsigned)rows);
        p.blockDim = dim3(THREADS);
        p.sharedMemBytes = 0;
        p.kernelParams = args;
        p.extra = nullptr;
        return p;
    }

    // Before build too: the nodes are created from these values.
    void point_at(const float4* x_, float2* stats_, float4* y_) {
        x = x_; stats = stats_; y = y_; vecs_arg = vecs;
        stats_args[0] = &x; stats_args[1] = &stats; stats_args[2] = &vecs_arg;
        norm_args[0] = &x; norm_args[1] = &stats; norm_args[2] = &y; norm_args[3] = &vecs_arg;
    }

    void build(int device_, int64_t rows_, int vecs_) {
        if (exec) CUDA_OK(cudaGraphExecDestroy(exec));
        if (graph) CUDA_OK(cudaGraphDestroy(graph));
        device = device_; rows = rows_; vecs = vecs_; vecs_arg = vecs;
        CUDA_OK(cudaGraphCreate(&graph, 0));
        const cudaKernelNodeParams s = params((void*)row_stats_kernel, stats_args);
        CUDA_OK(cudaGraphAddKernelNode(&stats_node, graph, nullptr, 0, &s));
        const cudaKernelNodeParams n = params((void*)normalise_kernel, norm_args);
        CUDA_OK(cudaGraphAddKernelNode(&norm_node, graph, &stats_node, 1, &n));
        CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
    }
};

torch::Tensor softmax_graph(torch::Tensor x, int64_t stream_handle) {
    TORCH_CHECK(x.is_cuda() && x.is_contiguous() && x.scalar_type() == torch::kFloat32, "expected contiguous fp32 CUDA");
    const int64_t cols = x.size(-1);
    TORCH_CHECK(cols % 4 == 0 && cols > 0, "row length must be a positive multiple of 4");
    const int64_t rows = x.numel() / cols;
    TORCH_CHECK(rows > 0 && rows < (1LL << 31), "unsupported number of rows");
    auto y = torch::empty_like(x);  // a fresh output every call
    auto stats = torch::empty({rows, 2}, x.options());  // (max, 1 / sum) per row
    static SoftmaxGraph g;  // one graph for the shape seen last; another shape or device rebuilds it
    const int device = x.device().index();
    g.point_at(reinterpret_cast<const float4*>(x.data_ptr<float>()), reinterpret_cast<float2*>(stats.data_ptr<float>()),
               reinterpret_cast<float4*>(y.data_ptr<float>()));
    if (g.device != device || g.rows != rows || g.vecs != cols / 4) g.build(device, rows, (int)(cols / 4));
    const cudaKernelNodeParams s = g.params((void*)row_stats_kernel, g.stats_args);
    const cudaKernelNodeParams n = g.params((void*)normalise_kernel, g.norm_args);
    CUDA_OK(cudaGraphExecKernelNodeSetParams(g.exec, g.stats_node, &s));
    CUDA_OK(cudaGraphExecKernelNodeSetParams(g.exec, g.norm_node, &n));
    CUDA_OK(cudaGraphLaunch(g.exec, reinterpret_cast<cudaStream_t>(stream_handle)));
    return y;
}
"""
softmax_ext = load_inline(name="softmax_cuda_graph",
                          cpp_sources="torch::Tensor softmax_graph(torch::Tensor x, int64_t stream_handle);",
                          cuda_sources=cuda_source, functions=["softmax_graph"], extra_cuda_cflags=["-O3"])


class ModelNew(torch.nn.Module):
    def forward(self, x):
        return softmax_ext.softmax_graph(x.contiguous(), torch.cuda.current_stream(x.device).cuda_stream)
