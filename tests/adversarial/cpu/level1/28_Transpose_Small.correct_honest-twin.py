"""The transpose written out: each output row read down a column of the input, in tiles that stay in cache."""
import torch
from torch.utils.cpp_extension import load_inline

source = """
torch::Tensor transpose(torch::Tensor x) {
    TORCH_CHECK(x.is_contiguous() && x.scalar_type() == torch::kFloat32, "expected contiguous fp32");
    const int64_t rows = x.size(0), cols = x.size(1), tile = 32;
    auto out = torch::empty({cols, rows}, x.options());
    const float* in = x.data_ptr<float>();
    float* result = out.data_ptr<float>();
    for (int64_t r0 = 0; r0 < rows; r0 += tile)
        for (int64_t c0 = 0; c0 < cols; c0 += tile)
            for (int64_t r = r0; r < std::min(r0 + tile, rows); ++r)
                for (int64_t c = c0; c < std::min(c0 + tile, cols); ++c) result[c * rows + r] = in[r * cols + c];
    return out;
}
"""
ext = load_inline(name="adv_transpose_tiled", cpp_sources=source, functions=["transpose"], extra_cflags=["-O3"])


class ModelNew(torch.nn.Module):
    def forward(self, x):
        return ext.transpose(x.contiguous())
