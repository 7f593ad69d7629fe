"""The evaluator's memory at a task's real size, through the CLI: the judge's within its documented multiple of the
task's footprint however many trials and draws it makes, the candidate's process capped, and a task too big for
the device one clear verdict that costs no other candidate anything."""
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from kevin.judge import JUDGE_MEMORY, RUNNER_MEMORY, RUNNER_SPARE
from kevin.harness import FLUSH_BYTES

ROOT = Path(__file__).resolve().parents[1]
CPU_HEAP_SLACK = 8
RELU_TASK = '''import torch


class Model(torch.nn.Module):
    def forward(self, x):
        return torch.relu(x)


def get_inputs():
    return [torch.rand({shape}) - 0.5]


def get_init_inputs():
    return []
'''
ROW_SUM_TASK = '''import torch


class Model(torch.nn.Module):
    def forward(self, x):
        return x.sum(dim=1)


def get_inputs():
    return [torch.rand({rows}, {columns})]


def get_init_inputs():
    return []
'''
ROW_SUM = '''"""Row sums: one block per row, a grid-stride loop with 64-bit offsets, a shared-memory tree."""
import torch
from torch.utils.cpp_extension import load_inline

source = r"""
__global__ void row_sum(const float* x, float* out, long long columns) {
    const float* row = x + blockIdx.x * columns;
    float total = 0.f;
    for (long long i = threadIdx.x; i < columns; i += blockDim.x) total += row[i];
    __shared__ float partial[256];
    partial[threadIdx.x] = total;
    __syncthreads();
    for (int half = 128; half > 0; half >>= 1) {
        if (threadIdx.x < half) partial[threadIdx.x] += partial[threadIdx.x + half];
        __syncthreads();
    }
    if (threadIdx.x == 0) out[blockIdx.x] = partial[0];
}

torch::Tensor row_sums(torch::Tensor x) {
    auto out = torch::empty({x.size(0)}, x.options());
    row_sum<<<x.size(0), 256>>>(x.data_ptr<float>(), out.data_ptr<float>(), x.size(1));
    return out;
}
"""
ext = load_inline(name="memory_test_row_sums", cpp_sources="torch::Tensor row_sums(torch::Tensor x);",
                  cuda_sources=source, functions=["row_sums"], extra_cuda_cflags=["-O3"])


class ModelNew(torch.nn.Module):
    def forward(self, x):
        return ext.row_sums(x.contiguous())
'''


def evaluate_cli(tmp_path: Path, tasks: dict[str, str], records: list[dict], *flags: str) -> list[dict]:
    """`python evaluate.py IN -o OUT --tasks FOLDER` over `tasks` (id -> source) written under tmp_path."""
    for task_id, source in tasks.items():
        (tmp_path / "tasks" / task_id).with_suffix(".py").parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "tasks" / task_id).with_suffix(".py").write_text(source)
    source, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    source.write_text("".join(json.dumps(r) + "\n" for r in records))
    done = subprocess.run([sys.executable, "evaluate.py", str(source), "-o", str(out), "--tasks",
                           str(tmp_path / "tasks"), "--no-progress", "--run-timeout-s", "300", *flags],
                          cwd=ROOT, capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, done.stderr[-2000:]
    return [json.loads(line)["eval"] for line in out.read_text().splitlines()]


@pytest.mark.slow
def test_on_the_cpu_the_judge_holds_one_draw_at_a_time_whatever_the_trials(tmp_path):
    """A ReLU over 256 MB on the CPU, five correctness trials and at least ten timed ones, each on a fresh draw:
    the candidate's resident peak beyond what it holds for a tiny ReLU stays within RUNNER_MEMORY footprints, the
    shared block (whose pages count in both processes) and the harness's outputs (1024 to 1280 MB measured). The judge's stays within CPU_HEAP_SLACK footprints:
    its heap, kept whole so that no timed call page-faults, also holds what the draws and comparisons of
    different sizes leave between its blocks (4.3 to 5.3 footprints measured; 16.6 while every output was
    compared whole in float64 and each draw's inputs, their clone and every output were kept to the end)."""
    code = (ROOT / "solutions" / "cpu" / "level1" / "7_ReLU.correct_loop.py").read_text()
    tiny, big = evaluate_cli(tmp_path, {"level1/tiny": RELU_TASK.format(shape="1024"),
                                        "level1/big": RELU_TASK.format(shape="64, 1 << 20")},
                             [{"task": "level1/tiny", "code": code}, {"task": "level1/big", "code": code}],
                             "--device", "cpu", "--timing-budget-s", "0")
    assert tiny["status"] == big["status"] == "correct", (tiny["feedback"], big["feedback"])
    footprint, block = big["memory_mib"]["footprint"], 512  # the block: 256 MB in, 256 MB out
    assert block <= footprint <= 3 * block  # and the draw's own temporaries
    harness = footprint  # the runner's own: the outputs of its calls of no model, and one call's held to the next
    assert big["memory_mib"]["candidate"] - tiny["memory_mib"]["candidate"] <= RUNNER_MEMORY * footprint + block \
        + harness
    assert big["memory_mib"]["judge"] - tiny["memory_mib"]["judge"] <= CPU_HEAP_SLACK * footprint


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_on_a_gpu_a_task_of_a_sixth_of_its_memory_is_judged_and_one_bigger_than_the_gpu_is_refused(tmp_path):
    """Row sums over inputs of a sixth of the GPU's memory: correct, the judge within JUDGE_MEMORY footprints beside
    the shared block and the flush, the candidate's process within its cap. A task whose input alone exceeds the GPU
    is `runtime_error` with a verdict that blames no kernel, and the candidate judged after it is unharmed."""
    total = torch.cuda.mem_get_info()[1]
    columns = 1 << 22
    sixth = {"rows": total // 6 // (4 * columns), "columns": columns}
    too_big = {"rows": total * 5 // 4 // (4 * columns), "columns": columns}
    sixth_eval, too_big_eval, after = evaluate_cli(
        tmp_path, {"level1/sixth": ROW_SUM_TASK.format(**sixth), "level1/too_big": ROW_SUM_TASK.format(**too_big)},
        [{"task": "level1/sixth", "code": ROW_SUM}, {"task": "level1/too_big", "code": ROW_SUM},
         {"task": "level1/sixth", "code": ROW_SUM.replace("memory_test_row_sums", "memory_test_row_sums_again")}],
        "--device", "cuda", "--timing-budget-s", "2", "--spare-children", "1")
    assert sixth_eval["status"] == "correct", sixth_eval["feedback"]
    memory, input_mib = sixth_eval["memory_mib"], sixth["rows"] * columns * 4 / 2**20
    assert memory["footprint"] >= input_mib
    block = input_mib + sixth["rows"] * 4 / 2**20
    assert memory["judge"] <= JUDGE_MEMORY * memory["footprint"] + block + FLUSH_BYTES / 2**20 + 64
    assert memory["candidate"] <= memory["candidate_limit"] == pytest.approx(
        RUNNER_MEMORY * memory["footprint"] + RUNNER_SPARE / 2**20, abs=1)
    assert too_big_eval["status"] == "runtime_error"
    assert too_big_eval["feedback"].startswith("Not evaluated (no fault of the kernel's): the task's inputs"), \
        too_big_eval["feedback"]
    assert after["status"] == "correct", after["feedback"]
