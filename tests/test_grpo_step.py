"""bench/grpo_step.py at toy sizes on the CPU, train.py's side only (TRL is a benchmark-only dependency)."""
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def run_bench(*args: str) -> subprocess.CompletedProcess:
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "grpo_step.py"), *args], capture_output=True,
                          text=True, cwd=ROOT, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def test_each_row_is_written_as_it_finishes_and_a_rerun_skips_it(tmp_path):
    out = tmp_path / "rows.json"
    run_bench("--rows", "tiny:full:16", "--sides", "project", "--out", str(out))
    [row] = json.loads(out.read_text())
    assert {k: row[k] for k in ("model", "mode", "reply_tokens", "side", "fits")} == \
        {"model": "tiny", "mode": "full", "reply_tokens": 16, "side": "project", "fits": True}
    assert row["tokens_per_s"] > 0 and len(row["grad_norm"]) == 2 and row["samples"] % row["micro_batch"] == 0
    again = run_bench("--rows", "tiny:full:16", "--sides", "project", "--out", str(out))
    assert json.loads(out.read_text()) == [row] and "| tiny | full | 16 |" in again.stdout


def test_a_bad_row_is_a_one_line_error(tmp_path):
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "grpo_step.py"), "--rows", "tiny:fsdp:16"],
                          capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert done.returncode != 0 and done.stderr.strip().splitlines() == [
        "--rows tiny:fsdp:16: want MODEL:MODE:REPLY_TOKENS, MODEL of ['tiny', '0.5b', '7b'], MODE of full, lora, "
        "zero3_offload"]
