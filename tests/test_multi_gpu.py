"""bench/multi_gpu.py: the bf16 DDP run matches one process and the report says so, the weights are
compared relative to the update, the Qwen2-0.5B-shaped model has Qwen2-0.5B's size, and (with 2 GPUs)
DDP and FSDP match one GPU and put each rank on its own GPU."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from kevin.tiny_model import QWEN2_05B_SHAPE

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
import multi_gpu  # noqa: E402


def run_bench(tmp_path: Path, *args: str, timeout: int = 300) -> tuple[subprocess.CompletedProcess, dict]:
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "multi_gpu.py"), "--work-dir", str(tmp_path / "work"),
                           "--out", str(tmp_path / "report.json"), *args],
                          capture_output=True, text=True, cwd=ROOT, timeout=timeout)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-8000:]
    return done, json.loads((tmp_path / "report.json").read_text())


@pytest.mark.slow
def test_two_processes_in_bf16_apply_the_update_of_one_within_the_bf16_tolerance(tmp_path):
    """test_train checks DDP in fp32; here bf16 autocast, through the bench's own launch and comparison."""
    done, report = run_bench(tmp_path, "--parts", "offline", "--models", "tiny", "--strategies", "ddp",
                             "--precisions", "bf16")
    [check] = report["checks"]
    assert check["pass"] is True and check["check"] == "offline tiny bf16: ddp x2 = 1 process"
    numbers, tol = report["offline"]["offline-tiny-bf16-ddp"], multi_gpu.TOLERANCES["bf16"]
    assert len(numbers["loss"]) == 2 and numbers["loss_rel"] <= tol["loss"] and numbers["weights_rel"] <= tol["weights"]
    assert numbers["update_max_abs"] == pytest.approx(4 * multi_gpu.LR, rel=0.05)  # Adam: ~lr per update, 2 x 2 updates
    assert "| offline tiny bf16: ddp x2 = 1 process | pass" in done.stdout


def fake_run(folder: Path, losses: list[float], weights: torch.Tensor) -> Path:
    (folder / "final").mkdir(parents=True)
    lines = [json.dumps({"step": i + 1, "train/loss": loss, "train/grad_norm": 1.0}) for i, loss in enumerate(losses)]
    folder.joinpath("metrics.jsonl").write_text("\n".join(lines) + "\n")
    save_file({"w": weights}, str(folder / "final" / "model.safetensors"))
    return folder


def test_weights_are_compared_relative_to_the_update_and_losses_per_step(tmp_path):
    initial = {"w": torch.zeros(4)}
    single = fake_run(tmp_path / "single", [1.0, 2.0], torch.ones(4))
    half_the_update = fake_run(tmp_path / "multi", [1.0, 1.0], torch.full((4,), 0.5))
    numbers = multi_gpu.compare_runs(half_the_update, single, initial)
    assert numbers["weights_rel"] == pytest.approx(0.5)  # ||0.5 - 1|| / ||1 - 0||
    assert numbers["weights_max_abs"] == 0.5 and numbers["update_max_abs"] == 1.0
    assert numbers["loss_rel"] == pytest.approx(0.5) and numbers["grad_norm_rel"] == 0.0  # step 2: |1 - 2| / 2
    assert numbers["weights_rel"] > max(t["weights"] for t in multi_gpu.TOLERANCES.values())


def test_the_qwen2_05b_shape_has_qwen2_05bs_parameter_count():
    from transformers import Qwen2Config, Qwen2ForCausalLM

    with torch.device("meta"):
        model = Qwen2ForCausalLM(Qwen2Config(**QWEN2_05B_SHAPE, tie_word_embeddings=True))
    assert sum(p.numel() for p in model.parameters()) == 494_032_768  # Qwen2-0.5B, embedding counted once
    assert model.model.layers[0].self_attn.k_proj.weight.shape == (2 * 64, 896)  # 2 key-value heads of 64
    assert model.lm_head.weight is model.model.embed_tokens.weight


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs")
def test_ddp_and_fsdp_match_one_gpu_and_each_rank_uses_its_own_gpu(tmp_path):
    """The tiny model only (the full demo adds the Qwen2-0.5B-shaped one and the evaluation part)."""
    done, report = run_bench(tmp_path, "--parts", "offline", "online", "--models", "tiny", "--num-processes", "2",
                             timeout=600)
    checks = {c["check"]: c for c in report["checks"]}
    for precision in ("fp32", "bf16"):
        for strategy in ("ddp", "fsdp"):
            assert checks[f"offline tiny {precision}: {strategy} x2 = 1 process"]["pass"] is True
    assert report["offline"]["offline-tiny-fp32-fsdp"]["sharded"] is True
    for strategy in ("ddp", "fsdp"):
        online = report["online"][f"online-tiny-{strategy}"]
        assert online["steps"] == 2 and online["placement"].startswith("r0->GPU0 r1->GPU1")
