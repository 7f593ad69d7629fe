"""bench/grpo_step.py at toy sizes on the CPU: train.py's side, and TRL's beside it where TRL is installed (a
benchmark-only dependency); bench/logprob_head.py, the output layer alone, likewise."""
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
import grpo_step  # noqa: E402


def run_bench(*args: str) -> subprocess.CompletedProcess:
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "grpo_step.py"), *args], capture_output=True,
                          text=True, cwd=ROOT, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    return done


@pytest.mark.slow
def test_each_row_is_written_as_it_finishes_and_a_rerun_skips_it(tmp_path):
    out = tmp_path / "rows.json"
    run_bench("--rows", "tiny:full:16", "--sides", "project", "--out", str(out))
    [row] = json.loads(out.read_text())
    assert {k: row[k] for k in ("model", "mode", "reply_tokens", "side", "fits")} == \
        {"model": "tiny", "mode": "full", "reply_tokens": 16, "side": "project", "fits": True}
    assert row["tokens_per_s"] > 0 and len(row["grad_norms"]) == 2 and row["samples"] % row["micro_batch"] == 0
    assert (row["forwards"], row["optimizer_steps"]) == (2 * row["samples"] // row["micro_batch"], 2)  # a window's
    assert len(row["window_s"]) == 3 and min(row["window_s"]) > 0
    assert row["forward_tokens"] == 2 * row["samples"] * (row["prompt_tokens"] + 16)  # both updates' batches
    assert 0.1 < row["host_peak_gib"] < 100
    assert row["memory_gib"] == {}  # train.py accounts for GPU memory only
    again = run_bench("--rows", "tiny:full:16", "--sides", "project", "--out", str(out))
    assert json.loads(out.read_text()) == [row] and "| tiny | full | 16 |" in again.stdout


@pytest.mark.slow
def test_a_profile_gives_the_ops_table_the_timeline_and_what_the_side_printed(tmp_path):
    run_bench("--rows", "tiny:full:16", "--sides", "project", "--repeats", "1", "--profile", str(tmp_path / "prof"),
              "--out", str(tmp_path / "rows.json"))
    stem = tmp_path / "prof" / "tiny-full-16-project"
    assert "aten::mm" in stem.with_suffix(".txt").read_text()
    events = json.loads(stem.with_suffix(".trace.json").read_text())["traceEvents"]
    assert any(e.get("name") == "aten::mm" for e in events)  # a timeline of the window's ops, for its gaps
    assert stem.with_suffix(".stderr.txt").exists()


@pytest.mark.slow
def test_a_bad_row_is_a_one_line_error(tmp_path):
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "grpo_step.py"), "--rows", "tiny:fsdp:16"],
                          capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert done.returncode != 0 and done.stderr.strip().splitlines() == [
        "--rows tiny:fsdp:16: want MODEL:MODE:REPLY_TOKENS, MODEL of ['tiny', '0.5b', '7b'], MODE of full, lora, "
        "zero3_offload"]


def test_without_trl_its_side_is_a_one_line_error_before_any_work(tmp_path, monkeypatch):
    """Not a row of TRL's that says it does not fit: that would be a false result."""
    monkeypatch.setitem(sys.modules, "trl", None)  # as if not installed: find_spec("trl") is None
    out = tmp_path / "rows.json"
    with pytest.raises(SystemExit) as exit:
        grpo_step.main(["--rows", "tiny:full:16", "--out", str(out)])
    assert str(exit.value) == ("error: --sides trl, but TRL is not installed (pip install trl; docs/training.md); "
                               "--sides project runs train.py's side alone")
    assert not out.exists()


def test_trl_and_train_py_do_the_same_work_and_agree_on_loss_and_gradient_norms(tmp_path):
    pytest.importorskip("trl")
    out = tmp_path / "rows.json"
    run_bench("--rows", "tiny:full:16", "--out", str(out))
    trl, own = json.loads(out.read_text())
    assert (trl["side"], own["side"]) == ("trl", "project")
    for key in ("forwards", "forward_tokens", "optimizer_steps"):
        assert trl[key] == own[key] > 0, key
    assert own["loss"] == pytest.approx(trl["loss"], rel=1e-4)
    assert own["grad_norms"] == pytest.approx(trl["grad_norms"], rel=1e-4)


def test_each_round_pairs_the_two_processes_that_ran_back_to_back():
    """Windows made up: the pooled ratio hides that the two rounds disagree and that each side's own processes
    disagree more (the resolution of the ratio); the table shows both."""
    def process(side, windows):
        return {"model": "tiny", "mode": "full", "reply_tokens": 16, "side": side, "fits": True, "peak_gib": None,
                "forward_tokens": 1000, "window_s": windows, "host_peak_gib": 1.0, "wall_s": 1.0,
                "tokens_per_s": 1000 / windows[1]}
    trl = grpo_step.pooled([process("trl", [1.0, 1.0, 1.0]), process("trl", [2.0, 2.0, 2.0])])
    own = grpo_step.pooled([process("project", [0.5, 0.5, 0.6]), process("project", [4.0, 4.0, 4.0])])
    assert grpo_step.round_ratios(trl, own) == [2.0, 0.5]
    assert (grpo_step.drift(trl), grpo_step.drift(own)) == (2.0, 8.0)
    row = "| tiny | full | 16 | 667 | 435 | 0.65x | 2.00, 0.50 | - | - | - | 2.00, 8.00 |"
    assert row in grpo_step.table([trl, own])
    one = grpo_step.pooled([process("trl", [1.0, 1.0, 1.0])])
    assert grpo_step.drift(one) is None and grpo_step.round_ratios(one, own) == []


def test_a_failed_child_is_its_first_exception_not_the_launchers_banner():
    stderr = """[rank0]: Traceback (most recent call last):
[rank0]:   File "bench/grpo_step.py", line 1, in <module>
[rank0]: ValueError: Please correct the following DeepSpeed config values that mismatch TrainingArguments values:
[rank0]: During handling of the above exception, another exception occurred:
[rank0]: Traceback (most recent call last):
[rank0]: RuntimeError: later
==============================================
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
==============================================
"""
    assert grpo_step.first_error(stderr) == ("ValueError: Please correct the following DeepSpeed config values that "
                                            "mismatch TrainingArguments values:")
    killed = "Root Cause (first observed failure):\n  exitcode  : -9 (pid: 12)\n  error_file: <N/A>\n" + "=" * 40
    assert grpo_step.first_error(killed) == "exitcode  : -9 (pid: 12)"


def test_the_output_layer_bench_times_every_chunk_beside_the_whole_logits(tmp_path):
    out = tmp_path / "head.json"
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "logprob_head.py"), "--shapes", "64:32:300",
                           "--chunks", "8", "16", "--repeats", "2", "--out", str(out)],
                          capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = json.loads(out.read_text())
    trl = ["TRL fused head"] if importlib.util.find_spec("trl") else []
    assert [r["path"] for r in rows] == ["whole logits", "chunk 8", "chunk 16", *trl, "4 matmuls"]
    assert all(r["ms"] > 0 for r in rows) and rows[0]["speedup_vs_whole"] == 1.0
    assert "| 64 | 32 | 300 | chunk 16 |" in done.stdout
