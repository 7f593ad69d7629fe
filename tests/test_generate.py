"""generate.py: prompts, reply parsing, the multi-turn loop with real backends, resuming, and the command line."""

import dataclasses
import importlib.util
import json
import os
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import torch

import generate
from kevin.evaluator import EvalConfig, STATUSES
from kevin.prompts import ATTEMPTS_HEADER, EXAMPLE_MODEL, EXAMPLE_SOLUTION, EXAMPLE_SUMMARY, FIRST_REQUEST, NEXT_REQUEST, NO_CODE, fit_prompt, parse_reply, render_prompt, split_reasoning
from kevin import rollouts
from kevin.rollout_config import GenerateConfig
from kevin.tasks import Task, load_tasks
from test_evaluate import ctrl_c_while_torch_loads, start_for_ctrl_c
from kevin import config_flags
from kevin.backends import HFBackend, OpenAIBackend, Reply
from kevin.static_rules import extract_code
from kevin.tiny_model import build_tiny_model

ROOT = Path(__file__).resolve().parent.parent
TASK_SOURCE = "import torch\n\nclass Model(torch.nn.Module):\n    def forward(self, x):\n        return x * 2\n"


def past_turn(turn: int, code: str | None, summary: str | None, feedback: str) -> dict:
    """A turn record as generate.py writes it (turns numbered from 1), reasoning included in the reply text."""
    return {"turn": turn, "reply": {"text": f"<think>REASONING {turn}</think> answer"}, "code": code,
            "summary": summary, "eval": {"feedback": feedback}}


def chars(messages: list[dict]) -> int:
    return sum(len(m["content"]) for m in messages)


def write_add_task(folder: Path) -> Path:
    """The one-shot example's own architecture as a task: the cheapest real task to evaluate on a CPU."""
    (folder / "toy").mkdir(parents=True, exist_ok=True)
    path = folder / "toy" / "add.py"
    path.write_text(EXAMPLE_MODEL)
    return path


def read_records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


# ---------------------------------------------------------------- prompts
def test_first_turn_prompt_has_rules_example_task_and_no_attempts():
    [message] = render_prompt(TASK_SOURCE, [], first_turn=True, device="cuda")
    text = message["content"]
    assert message["role"] == "user"
    assert "load_inline" in text and "__global__" in text  # the rules and the CUDA example
    assert EXAMPLE_SOLUTION["cuda"] in text and EXAMPLE_SUMMARY in text
    assert TASK_SOURCE in text
    assert "previous attempts" not in text
    assert text.endswith(FIRST_REQUEST)


def test_later_turn_prompt_lists_attempts_with_code_summary_and_feedback_but_no_example_or_reasoning():
    history = [past_turn(1, "CODE_ZERO", "SUMMARY_ZERO", "Compilation failed: FEEDBACK_ZERO"),
               past_turn(2, "CODE_ONE", "SUMMARY_ONE", "Correct. FEEDBACK_ONE")]
    text = render_prompt(TASK_SOURCE, history, first_turn=False, device="cuda")[0]["content"]
    for needle in ("CODE_ZERO", "SUMMARY_ZERO", "FEEDBACK_ZERO", "CODE_ONE", "SUMMARY_ONE", "FEEDBACK_ONE",
                   "### Attempt 1", "### Attempt 2", TASK_SOURCE):
        assert needle in text
    assert text.index("CODE_ZERO") < text.index("CODE_ONE")
    assert "REASONING" not in text
    assert EXAMPLE_SOLUTION["cuda"] not in text and EXAMPLE_SUMMARY not in text
    assert text.endswith(NEXT_REQUEST) and "Restart your reasoning" in text


def test_attempt_without_code_is_shown_as_such():
    history = [past_turn(1, None, None, "Format error: no block")]
    text = render_prompt(TASK_SOURCE, history, first_turn=False, device="cuda")[0]["content"]
    assert NO_CODE in text and "Your summary: (none)" in text and "Format error: no block" in text


def test_cpu_prompt_asks_for_cpp_with_cpp_sources_only_and_shows_the_cpu_example():
    text = render_prompt(TASK_SOURCE, [], first_turn=True, device="cpu")[0]["content"]
    assert "C++" in text and "cpp_sources` only" in text
    assert EXAMPLE_SOLUTION["cpu"] in text and "__global__" not in text


def test_budget_drops_the_earliest_attempts_first():
    history = [past_turn(t + 1, f"CODE_{t}" + "x" * 1000, f"SUMMARY_{t}", f"FEEDBACK_{t}") for t in range(4)]
    everything = chars(render_prompt(TASK_SOURCE, history, False, "cuda"))
    last_two = chars(render_prompt(TASK_SOURCE, history[2:], False, "cuda"))
    text = fit_prompt(TASK_SOURCE, history, "cuda", budget=last_two, count_tokens=chars)[0]["content"]
    assert "CODE_0" not in text and "CODE_1" not in text
    assert "CODE_2" in text and "CODE_3" in text and "### Attempt 3" in text  # numbering keeps the real turn
    full = fit_prompt(TASK_SOURCE, history, "cuda", budget=everything, count_tokens=chars)[0]["content"]
    assert all(f"CODE_{t}" in full for t in range(4))


def test_prompt_that_cannot_fit_keeps_the_task_and_drops_every_attempt():
    history = [past_turn(1, "CODE_0", "SUMMARY_0", "FEEDBACK_0")]
    text = fit_prompt(TASK_SOURCE, history, "cuda", budget=10, count_tokens=chars)[0]["content"]
    assert TASK_SOURCE in text and "CODE_0" not in text
    assert EXAMPLE_SUMMARY not in text  # still a later turn: no example


# ---------------------------------------------------------------- reply parsing
def test_reply_without_code_has_no_code_and_no_summary():
    assert parse_reply("I would write a kernel, but here is only prose.") == (None, None)
    assert parse_reply("") == (None, None)


def test_code_is_the_last_block_and_summary_the_text_after_it():
    reply = "First try:\n```python\nOLD\n```\nBetter:\n```python\nNEW\n```\n\n  I fused the ops.  \n"
    assert parse_reply(reply) == ("NEW\n", "I fused the ops.")


def test_block_at_the_very_end_gives_an_empty_summary():
    assert parse_reply("```python\nCODE\n```") == ("CODE\n", "")


def test_code_inside_the_reasoning_is_ignored():
    reply = "<think>maybe\n```python\nDRAFT\n```\n</think>Final:\n```python\nFINAL\n```\nDone."
    assert split_reasoning(reply) == ("maybe\n```python\nDRAFT\n```\n", "Final:\n```python\nFINAL\n```\nDone.")
    assert parse_reply(reply) == ("FINAL\n", "Done.")


def test_reasoning_opened_by_the_chat_template_ends_at_the_closing_tag():
    reasoning, answer = split_reasoning("thinking without an opening tag</think>\n```python\nX\n```\nS")
    assert reasoning == "thinking without an opening tag"
    assert parse_reply("thinking</think>\n```python\nX\n```\nS") == ("X\n", "S")


def test_reply_cut_off_while_reasoning_has_no_code():
    reply = "<think>I will write\n```python\nHALF\n```\nand then"
    assert split_reasoning(reply)[1] == ""
    assert parse_reply(reply) == (None, None)


def test_unterminated_fence_is_not_code():
    assert parse_reply("Here:\n```python\nimport torch\nclass ModelNew") == (None, None)


def test_unterminated_fence_after_a_complete_block_leaves_the_complete_block():
    code, summary = parse_reply("```python\nDONE\n```\nNow a second version:\n```python\nHALF")
    assert code == "DONE\n" and summary.startswith("Now a second version")


@pytest.mark.parametrize("reply", [
    "```python\nA\n```\ntext\n```\nB\n```\nsummary",
    "```python\nA\n```\nRun it with:\n```bash\npython run.py\n```",
    "<think>```python\nR\n```</think>```cpp\nC\n```\nS",
    "```python\nA\n```\n```python\nB",
])
def test_the_parsed_code_is_the_candidate_evaluate_takes(reply):
    assert parse_reply(reply)[0] == extract_code(split_reasoning(reply)[1])


# ---------------------------------------------------------------- the loop, with real backends
class CountingHFBackend(HFBackend):
    """The real hf backend on the tiny model, counting its generate calls to show what a resume skips."""

    calls = 0

    def generate(self, prompts, seeds):
        self.calls += 1
        return super().generate(prompts, seeds)


@pytest.fixture(scope="module")
def tiny_backend():
    return CountingHFBackend(build_tiny_model(), temperature=0.9, max_tokens=24)


def run_args(tasks: Path, out: Path, *extra: str) -> list[str]:
    return ["--tasks", str(tasks), "--out", str(out), "--n-trajectories", "2", "--turns", "2",
            "--device", "cpu", *extra]


@pytest.mark.slow
def test_hf_loop_writes_one_record_per_trajectory_with_every_turn(tmp_path, tiny_backend):
    write_add_task(tmp_path / "tasks")
    out = tmp_path / "rollouts.jsonl"
    generate.main(run_args(tmp_path / "tasks", out), backend=tiny_backend)
    records = read_records(out)
    assert [(r["task"], r["trajectory"]) for r in records] == [("toy/add", 0), ("toy/add", 1)]
    tokenizer = tiny_backend.tokenizer
    for record in records:
        assert [t["turn"] for t in record["turns"]] == [1, 2]  # numbered from 1, as every table is
        for turn in record["turns"]:
            assert set(turn) == {"turn", "prompt", "reply", "code", "summary", "eval"}
            prompt, reply = turn["prompt"], turn["reply"]
            assert prompt["token_ids"] == tiny_backend.prompt_token_ids(prompt["messages"])
            assert tokenizer.decode(prompt["token_ids"]).startswith("<|im_start|>user\n")
            assert 0 < len(reply["token_ids"]) <= 24 and len(reply["logprobs"]) == len(reply["token_ids"])
            assert all(lp <= 0 for lp in reply["logprobs"])
            assert reply["text"] == tokenizer.decode(reply["token_ids"], skip_special_tokens=True)
            assert turn["eval"]["status"] in STATUSES and isinstance(turn["eval"]["feedback"], str)
        first, second = (t["prompt"]["messages"][0]["content"] for t in record["turns"])
        assert EXAMPLE_SUMMARY in first and EXAMPLE_SUMMARY not in second
        assert record["turns"][0]["eval"]["feedback"] in second


def test_hf_logprobs_are_those_of_the_sampling_distribution_at_the_temperature(tiny_backend):
    prompt = [{"role": "user", "content": "Write a kernel."}]
    [reply] = tiny_backend.generate([prompt], [3])
    prompt_ids = tiny_backend.prompt_token_ids(prompt)
    ids = torch.tensor([prompt_ids + reply.token_ids])
    with torch.no_grad():
        logits = tiny_backend.model(ids.to(tiny_backend.model.device)).logits[0, len(prompt_ids) - 1:-1].cpu()
    expected = torch.log_softmax(logits / 0.9, dim=-1).gather(1, ids[0, len(prompt_ids):, None])[:, 0]
    assert torch.allclose(torch.tensor(reply.logprobs), expected, atol=1e-4)
    raw = torch.log_softmax(logits, dim=-1).gather(1, ids[0, len(prompt_ids):, None])[:, 0]
    assert not torch.allclose(torch.tensor(reply.logprobs), raw, atol=1e-4)


@pytest.mark.slow
def test_rerun_with_the_same_out_resumes_without_generating_again(tmp_path, tiny_backend):
    write_add_task(tmp_path / "tasks")
    out = tmp_path / "rollouts.jsonl"
    generate.main(run_args(tmp_path / "tasks", out), backend=tiny_backend)
    calls, written = tiny_backend.calls, out.read_text()

    generate.main(run_args(tmp_path / "tasks", out), backend=tiny_backend)
    assert tiny_backend.calls == calls and out.read_text() == written

    first_line = written.splitlines(keepends=True)[0]
    out.write_text(first_line + written.splitlines()[1][:40])  # trajectory 1 cut off mid-write
    generate.main(run_args(tmp_path / "tasks", out), backend=tiny_backend)
    assert tiny_backend.calls == calls + 2  # one batch per turn, for trajectory 1 only
    lines = out.read_text().splitlines(keepends=True)
    assert lines[0] == first_line and json.loads(lines[1])["trajectory"] == 1 and len(lines) == 2


@pytest.mark.slow
def test_blank_lines_in_an_existing_out_are_skipped_on_resume(tmp_path, tiny_backend):
    write_add_task(tmp_path / "tasks")
    out = tmp_path / "rollouts.jsonl"
    generate.main(run_args(tmp_path / "tasks", out), backend=tiny_backend)
    calls = tiny_backend.calls
    out.write_text(out.read_text().replace("\n", "\n\n", 1) + "   \n")
    generate.main(run_args(tmp_path / "tasks", out), backend=tiny_backend)
    assert tiny_backend.calls == calls


@pytest.mark.slow
def test_the_summary_after_a_resume_covers_the_whole_output(tmp_path, tiny_backend, capsys):
    write_add_task(tmp_path / "tasks")
    out = tmp_path / "rollouts.jsonl"
    generate.main(run_args(tmp_path / "tasks", out, "--n-trajectories", "1"), backend=tiny_backend)
    capsys.readouterr()
    generate.main(run_args(tmp_path / "tasks", out, "--n-trajectories", "3"), backend=tiny_backend)
    err = capsys.readouterr().err
    assert "3 trajectories of 1 tasks, by turn:" in err
    table = err.split("mean speedup of correct\n")[1].splitlines()
    assert [line.split()[:2] for line in table] == [["1", "3"], ["2", "3"]]  # turn, kernels: old and new rows


def test_summary_of_no_trajectories_says_no_rows():
    assert generate.summary_table([]) == "no rows: no trajectories to summarise"


# ---------------------------------------------------------------- Ctrl-C
def test_ctrl_c_while_torch_imports_is_one_line(tmp_path):
    returncode, stderr = ctrl_c_while_torch_loads([sys.executable, str(ROOT / "generate.py"), "--out",
                                                   str(tmp_path / "o.jsonl"), "--device", "cpu"])
    assert returncode == 130 and stderr.splitlines() == ["interrupted: while starting, before writing anything"], stderr
    assert not (tmp_path / "o.jsonl").exists()


@pytest.mark.slow
def test_ctrl_c_says_how_many_trajectories_are_written_and_a_rerun_does_the_rest(tmp_path, tiny_backend, capsys):
    """Ctrl-C to the whole foreground group once the first task's trajectories are written, while the second
    task's are generated or evaluated: one line, exit 130, and the file holds what the line says."""
    write_add_task(tmp_path / "tasks")
    (tmp_path / "tasks" / "toy" / "add_again.py").write_text(EXAMPLE_MODEL)
    out = tmp_path / "rollouts.jsonl"
    argv = run_args(tmp_path / "tasks", out, "--tasks-per-batch", "1", "--max-tokens", "16")
    proc = start_for_ctrl_c([sys.executable, str(ROOT / "generate.py"), *argv])
    deadline = time.monotonic() + 300
    while not (out.exists() and out.read_text()) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    os.killpg(proc.pid, signal.SIGINT)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130, stderr[-3000:]
    assert "Traceback" not in stderr, stderr[-3000:]
    assert stderr.splitlines()[-1] == "interrupted: 2 of 4 trajectories written; re-run to resume", stderr[-3000:]
    written = read_records(out)
    assert [(r["task"], r["trajectory"], len(r["turns"])) for r in written] == [("toy/add", 0, 2), ("toy/add", 1, 2)]

    capsys.readouterr()
    generate.main(argv, backend=tiny_backend)
    assert "2 tasks x 2 trajectories: 2 already in" in capsys.readouterr().err
    records = read_records(out)
    assert records[:2] == written and [r["task"] for r in records[2:]] == ["toy/add_again"] * 2


class ScriptedBackend:
    """Stands in for a model that can write code (a random tiny model cannot): turn 1 answers with the
    one-shot example's own correct C++ solution, later turns with prose only. Token ids are not known."""

    def __init__(self):
        self.prompts: list[list[dict]] = []

    def prompt_token_ids(self, messages):
        return None

    def count_tokens(self, messages):
        return chars(messages) // 4

    def generate(self, prompts, seeds):
        self.prompts.extend(prompts)
        first_turn = ATTEMPTS_HEADER not in prompts[0][0]["content"]
        text = (f"<think>SECRET REASONING</think>Here it is:\n```python\n{EXAMPLE_SOLUTION['cpu']}```\n"
                f"{EXAMPLE_SUMMARY}" if first_turn else "I have nothing better.")
        return [Reply(text, None, None) for _ in prompts]


@pytest.mark.slow
def test_a_correct_cpp_kernel_is_evaluated_and_fed_back_into_the_next_turn(tmp_path):
    write_add_task(tmp_path / "tasks")
    out = tmp_path / "rollouts.jsonl"
    backend = ScriptedBackend()
    generate.main(run_args(tmp_path / "tasks", out), backend=backend)
    for record in read_records(out):
        first, second = record["turns"]
        assert first["code"] == EXAMPLE_SOLUTION["cpu"] and first["summary"] == EXAMPLE_SUMMARY
        assert first["eval"]["status"] == "correct" and first["eval"]["speedup"] > 0
        next_prompt = second["prompt"]["messages"][0]["content"]
        assert first["eval"]["feedback"] in next_prompt and EXAMPLE_SUMMARY in next_prompt
        assert "SECRET REASONING" not in next_prompt
        assert second["code"] is None and second["summary"] is None
        assert second["eval"]["status"] == "format_error" and not second["eval"]["compiled"]
    assert len(backend.prompts) == 4  # 2 trajectories x 2 turns


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_the_cuda_example_is_correct_through_the_loop_on_a_gpu(tmp_path):
    write_add_task(tmp_path / "tasks")
    out = tmp_path / "rollouts.jsonl"

    class CudaScript(ScriptedBackend):
        def generate(self, prompts, seeds):
            text = f"```python\n{EXAMPLE_SOLUTION['cuda']}```\n{EXAMPLE_SUMMARY}"
            return [Reply(text, None, None) for _ in prompts]

    generate.main(["--tasks", str(tmp_path / "tasks"), "--out", str(out), "--n-trajectories", "1", "--turns", "1",
                   "--device", "cuda"], backend=CudaScript())
    [record] = read_records(out)
    assert record["turns"][0]["eval"]["status"] == "correct", record["turns"][0]["eval"]["feedback"]


@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm is not installed (see docs/generation.md)")
def test_vllm_backend_runs_the_loop_on_the_tiny_model(tmp_path):
    """The real command line, in a subprocess: vLLM starts its engine best from a fresh `__main__`."""
    write_add_task(tmp_path / "tasks")
    out = tmp_path / "rollouts.jsonl"
    command = [sys.executable, str(ROOT / "generate.py"), "--backend", "vllm", "--gpu-memory-utilization", "0.3",
               *run_args(tmp_path / "tasks", out, "--max-tokens", "16")]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    records = read_records(out)
    assert len(records) == 2
    for turn in (t for r in records for t in r["turns"]):
        reply = turn["reply"]
        assert 0 < len(reply["token_ids"]) <= 16 and len(reply["logprobs"]) == len(reply["token_ids"])
        assert all(lp <= 0 for lp in reply["logprobs"])
        assert turn["prompt"]["token_ids"][:1] == [1]  # <|im_start|> of the tiny tokenizer
        assert turn["eval"]["status"] in STATUSES
    assert "mean speedup" in done.stderr


class ChatServer(BaseHTTPRequestHandler):
    """Stands in for an OpenAI-compatible server: fails the first request with a 500, then answers with
    split-off reasoning and log-probs, recording every request body."""

    bodies: list[dict] = []
    headers_seen: list[str] = []

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).bodies.append(body)
        type(self).headers_seen.append(self.headers.get("Authorization"))
        if len(type(self).bodies) == 1:
            self.send_error(500)
            return
        answer = {"choices": [{"message": {"content": f"seed {body['seed']}", "reasoning_content": "hmm"},
                               "logprobs": {"content": [{"token": "a", "logprob": -0.5},
                                                        {"token": "b", "logprob": -1.5}]}}]}
        data = json.dumps(answer).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        """Keep the test output quiet."""


def test_openai_backend_retries_keeps_order_and_rejoins_reasoning():
    server = ThreadingHTTPServer(("127.0.0.1", 0), ChatServer)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        backend = OpenAIBackend("some-model", 0.9, 100, f"http://127.0.0.1:{server.server_port}/v1", "KEY",
                                concurrency=1, retries=2)
        replies = backend.generate([[{"role": "user", "content": "a"}], [{"role": "user", "content": "b"}]], [7, 8])
    finally:
        server.shutdown()
    assert [r.text for r in replies] == ["<think>hmm</think>seed 7", "<think>hmm</think>seed 8"]
    assert replies[0].logprobs == [-0.5, -1.5] and replies[0].token_ids is None
    assert len(ChatServer.bodies) == 3  # the failed request was sent again
    assert ChatServer.bodies[1] == {"model": "some-model", "messages": [{"role": "user", "content": "a"}],
                                    "temperature": 0.9, "top_p": 1.0, "presence_penalty": 0.0,
                                    "frequency_penalty": 0.0, "max_tokens": 100, "seed": 7, "logprobs": True}
    assert set(ChatServer.headers_seen) == {"Bearer KEY"}


def openai_cli(base_url: str, tasks: Path, out: Path, *extra: str) -> list[str]:
    """generate.py's command line for one toy task on the CPU, its replies from the server at `base_url`."""
    return [sys.executable, str(ROOT / "generate.py"), "--backend", "openai", "--base-url", base_url,
            "--model", "m", "--tasks", str(tasks), "--out", str(out), "--n-trajectories", "2", "--turns", "1",
            "--device", "cpu", *extra]


@pytest.mark.slow
@pytest.mark.parametrize("before", [None, '{"task": "toy/add", "trajectory": 0, "turns": []}\n'])
def test_openai_without_a_server_fails_at_once_naming_the_url_and_leaves_the_out_as_it_was(tmp_path, before):
    """A refused connection cannot pass: no retries (the default 5 took 63 s), and no empty file left behind."""
    from test_openai_server import free_port

    write_add_task(tmp_path / "tasks")
    out, url = tmp_path / "o.jsonl", f"http://127.0.0.1:{free_port()}/v1"
    if before is not None:
        out.write_text(before)
    began = time.monotonic()
    done = subprocess.run(openai_cli(url, tmp_path / "tasks", out), capture_output=True, text=True, timeout=60)
    assert time.monotonic() - began < 30
    assert_one_line_error(done, f"error: cannot reach {url}/chat/completions: [Errno 111] Connection refused")
    assert (out.read_text() if out.exists() else None) == before


def test_openai_retries_only_what_can_pass_and_waits_briefly(monkeypatch):
    """A 503 is retried with back-off capped at RETRY_WAIT_S; a 404 is not retried."""
    from kevin import backends

    class Failing(BaseHTTPRequestHandler):
        def do_POST(self):
            self.rfile.read(int(self.headers["Content-Length"]))
            self.send_error(503 if self.path.startswith("/busy") else 404)

        def log_message(self, *args):
            """Keep the test output quiet."""

    waits = []
    monkeypatch.setattr(backends.time, "sleep", waits.append)
    server = ThreadingHTTPServer(("127.0.0.1", 0), Failing)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        with pytest.raises(SystemExit, match="answered 503"):
            backends.post_json(f"http://127.0.0.1:{server.server_port}/busy", {}, None, retries=5, timeout_s=10)
        assert waits == [1, 2, 4, 8, 8]
        with pytest.raises(SystemExit, match="answered 404"):
            backends.post_json(f"http://127.0.0.1:{server.server_port}/gone", {}, None, retries=5, timeout_s=10)
        assert waits == [1, 2, 4, 8, 8]
    finally:
        server.shutdown()


@pytest.mark.slow
def test_a_second_run_on_an_out_being_written_stops_at_once_and_the_first_writes_each_trajectory_once(tmp_path):
    """As evaluate.py -o: the first run holds --out locked, so a second one on it refuses in one line instead of
    writing every trajectory again. The first run's replies wait until the second has been turned away."""
    asked, release = threading.Event(), threading.Event()

    class Stalling(BaseHTTPRequestHandler):
        def do_POST(self):
            self.rfile.read(int(self.headers["Content-Length"]))
            asked.set()
            release.wait(timeout=300)
            data = json.dumps({"choices": [{"message": {"content": "no code"}}]}).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args):
            """Keep the test output quiet."""

    write_add_task(tmp_path / "tasks")
    out = tmp_path / "o.jsonl"
    server = ThreadingHTTPServer(("127.0.0.1", 0), Stalling)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    command = openai_cli(f"http://127.0.0.1:{server.server_port}/v1", tmp_path / "tasks", out)
    first = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        assert asked.wait(timeout=120), "the first run sent no request"
        second = subprocess.run(command, capture_output=True, text=True, timeout=60)
        assert_one_line_error(second, f"error: {out} is being written by another run; wait for it to end")
    finally:
        release.set()
        _, stderr = first.communicate(timeout=300)
        server.shutdown()
    assert first.returncode == 0, stderr[-3000:]
    assert [(r["task"], r["trajectory"]) for r in read_records(out)] == [("toy/add", 0), ("toy/add", 1)]


@pytest.mark.slow
def test_an_out_in_a_missing_folder_is_refused_with_the_line_evaluate_gives(tmp_path):
    """One behaviour for both stages: neither makes a missing folder (a typo would scatter outputs)."""
    write_add_task(tmp_path / "tasks")
    missing = tmp_path / "no" / "such"
    ours = run_cli("--tasks", str(tmp_path / "tasks"), "--device", "cpu", "--out", str(missing / "o.jsonl"))
    theirs = subprocess.run([sys.executable, str(ROOT / "evaluate.py"), "--device", "cpu", "-o",
                             str(missing / "o.jsonl")], capture_output=True, text=True, cwd=ROOT, timeout=120)
    expected = f"error: cannot write {missing / 'o.jsonl'}: No such file or directory"
    assert_one_line_error(ours, expected)
    assert_one_line_error(theirs, expected)
    assert ours.stderr.strip().splitlines()[-1] == theirs.stderr.strip().splitlines()[-1] == expected
    assert not (tmp_path / "no").exists()


# ---------------------------------------------------------------- the loop without a barrier between turns
# The example's extension (in the build cache) on the first 10 elements: its verdict, a shape mismatch, reads the
# same whatever inputs the judge draws, so the next turn's prompt does too.
WRONG_KERNEL = EXAMPLE_SOLUTION["cpu"].replace("add_ext.add(a.contiguous(), b.contiguous())",
                                               "add_ext.add(a[:10].contiguous(), b[:10].contiguous())")


def seed_of(trajectory: int, turn: int) -> int:
    """The sampling seed of a toy/add trajectory's turn (from 1) at seed 0."""
    return rollouts.reply_seed(0, {"task": "toy/add", "trajectory": trajectory, "turns": [None] * (turn - 1)})


class OneKernelWriter(HFBackend):
    """The tiny model, but for trajectory 0's first reply: a kernel that builds and is judged wrong (WRONG_KERNEL),
    in seconds where a junk reply's format error takes none. Records each generate call: its start, its end and
    its seeds."""

    calls: list[tuple[float, float, list[int]]] = []

    def generate(self, prompts, seeds):
        began = time.perf_counter()
        replies = super().generate(prompts, seeds)
        self.calls.append((began, time.perf_counter(), list(seeds)))
        text = f"```python\n{WRONG_KERNEL}```\nI add the inputs."
        return [Reply(text, self.tokenizer(text).input_ids, None) if seed == seed_of(0, 1) else reply
                for reply, seed in zip(replies, seeds)]


@pytest.fixture(scope="module")
def both_orders(tmp_path_factory):
    """Two trajectories x two turns of toy/add through run_turns and the real evaluator on the CPU, synchronous
    and overlapped: overlap -> (records, the backend's calls)."""
    path = write_add_task(tmp_path_factory.mktemp("tasks"))
    task = Task("toy/add", path, path.read_text())
    backend = OneKernelWriter(build_tiny_model(), temperature=0.9, max_tokens=24)
    runs = {}
    for overlap in (False, True):
        backend.calls = []
        records = [{"task": "toy/add", "trajectory": k, "turns": []} for k in range(2)]
        rollouts.run_turns(records, [task, task], backend, EvalConfig(device="cpu", spare_children=0, progress=False),
                           turns=2, seed=0, device="cpu", context_budget=16384, overlap=overlap)
        runs[overlap] = records, backend.calls
    return runs


def test_overlapped_rollouts_give_the_records_of_the_synchronous_loop(both_orders):
    """Other batches (the overlapped loop generates each trajectory's second turn alone), the same records: the
    same tokens, texts, prompts and verdicts; the log-probs to the last bits that a batch's size and padding
    change; only the evaluator's clocks differ."""
    (sync, sync_calls), (overlapped, calls) = both_orders[False], both_orders[True]
    assert [seeds for *_, seeds in sync_calls] == [[seed_of(0, 1), seed_of(1, 1)], [seed_of(0, 2), seed_of(1, 2)]]
    assert [seeds for *_, seeds in calls] == [[seed_of(0, 1), seed_of(1, 1)], [seed_of(1, 2)], [seed_of(0, 2)]]
    assert overlapped[0]["turns"][0]["eval"]["status"] == "incorrect"

    def without_clocks(record: dict) -> tuple[dict, list]:
        turns = [{**turn, "reply": {**turn["reply"], "logprobs": None},
                  "eval": {k: v for k, v in turn["eval"].items() if k not in ("time_s", "cpu_s", "memory_mib")}}
                 for turn in record["turns"]]
        return {**record, "turns": turns}, [turn["reply"]["logprobs"] or [] for turn in record["turns"]]

    for one, other in zip(sync, overlapped):
        (same, logprobs), (same_too, other_logprobs) = without_clocks(one), without_clocks(other)
        assert same == same_too
        assert all(a == pytest.approx(b, abs=1e-5) for a, b in zip(logprobs, other_logprobs))


@pytest.mark.slow
def test_overlapped_a_trajectory_writes_its_next_turn_while_another_kernel_is_still_judged(both_orders):
    """Trajectory 0's kernel is judged from the end of the first batch for its total time; trajectory 1's second
    turn is generated inside that window when overlapped, and only after it when synchronous."""
    for overlap, (records, calls) in both_orders.items():
        times = records[0]["turns"][0]["eval"]["time_s"]
        judged_by = calls[0][1] + times["total"] + times.get("queued", 0.0)  # its own time and its wait behind others
        second_turn_began = next(began for began, _, seeds in calls if seed_of(1, 2) in seeds)
        assert (second_turn_began < judged_by) == overlap


# ---------------------------------------------------------------- command line
@pytest.mark.slow
def test_help_is_quick_because_no_model_library_is_imported_at_the_top():
    """torch comes with evaluate, the judge every stage imports at the top; the model libraries (transformers,
    vLLM: seconds to import) wait until a model is loaded."""
    check = "import sys, generate; print(sorted({'transformers', 'vllm'} & set(sys.modules)))"
    done = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert done.stdout.strip() == "[]"
    done = subprocess.run([sys.executable, "generate.py", "--help"], capture_output=True, text=True, cwd=ROOT,
                          timeout=60)
    assert done.returncode == 0 and "--n-trajectories" in done.stdout and "--context-budget" in done.stdout


@pytest.mark.parametrize("stage, missing", [("generate.py", "tqdm, torch"), ("evaluate.py", "torch"),
                                            ("train.py", "torch, accelerate, transformers, tqdm")])
def test_a_stage_run_before_the_install_says_what_to_install_in_one_line(stage, missing):
    """python -S: the same interpreter without its site-packages, as on a machine before the README's install."""
    done = subprocess.run([sys.executable, "-S", stage, "--help"], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr.splitlines() == [f"error: not installed: {missing}. Install first: pip install -e . "
                                        "(the README's first lines)"]


def test_paper_defaults():
    args = generate.parse_args(["--out", "x.jsonl"])
    assert (args.n_trajectories, args.turns, args.temperature, args.max_tokens) == (16, 4, 0.9, 16384)
    assert args.model == "tiny" and args.backend == "hf" and args.device == "auto"  # evaluate.py's default


def test_every_config_field_is_a_flag_with_its_docstring_as_help(monkeypatch):
    """The shared rollout fields too: their docstrings live in kevin/rollout_config.py. Lines as wide as a help
    ever gets, so that argparse breaks none at a hyphen."""
    monkeypatch.setenv("COLUMNS", "1000")
    help_text = " ".join(generate._parser().format_help().split())
    docs = config_flags.field_docs(GenerateConfig)
    assert set(docs) == {f.name for f in dataclasses.fields(GenerateConfig)}
    for name, doc in docs.items():
        assert f"--{name.replace('_', '-')}" in help_text and doc in help_text, name
    args = generate.parse_args(["--out", "o", "--gpus", "0,2", "--turns", "8", "--device", "cpu"])
    assert (args.out, args.gpus, args.turns, args.device) == ("o", [0, 2], 8, "cpu")
    assert generate.parse_args(["--out", "o"]) == GenerateConfig(out="o")


def run_cli(*argv: str, timeout: int = 60, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "generate.py"), *argv], capture_output=True, text=True,
                          cwd=kwargs.pop("cwd", ROOT), timeout=timeout, **kwargs)


def assert_one_line_error(done: subprocess.CompletedProcess, message: str) -> None:
    """Exit status 1 or 2, the message on the last line of stderr, no traceback."""
    assert done.returncode in (1, 2), done.stderr[-2000:]
    assert message in done.stderr.strip().splitlines()[-1] and "Traceback" not in done.stderr, done.stderr[-2000:]


@pytest.mark.parametrize("argv", [["generate.py", "--out", "o.jsonl", "--turns", "0"], ["reward.py", "no/such.jsonl"],
                                  ["scale_test.py"], ["train.py", "--turns", "0"],
                                  ["warm_start.py", "--out", "o", "--hidden", "65"]])
@pytest.mark.slow
def test_every_stage_script_starts_its_one_line_errors_with_error(argv):
    """As evaluate.py's do, and argparse's (`prog: error: ...`): one word to look for, whichever stage failed (the
    missing install's line too: above)."""
    done = subprocess.run([sys.executable, *argv], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert_one_line_error(done, "")
    assert done.stderr.strip().splitlines()[-1].startswith("error: "), done.stderr


@pytest.mark.parametrize("argv, message", [
    (["--tasks", "no/such/place"], "not a task file, a folder or a split"),
    (["--split", "no-such-split"], "--split no-such-split"),
    (["--gpus", "0,x"], "--gpus"),
    (["--turns", "0"], "--turns must be at least 1"),
    (["--temperature", "0"], "--temperature must be positive"),
    (["--temperature", "-1"], "--temperature must be positive"),
    (["--model", "/nonexistent"], "--model /nonexistent: no such folder"),
])
@pytest.mark.slow
def test_bad_input_is_a_one_line_error(tmp_path, argv, message):
    assert_one_line_error(run_cli("--out", str(tmp_path / "o.jsonl"), "--device", "cpu", *argv), message)


def test_a_model_id_neither_local_nor_served_by_the_hub_fails_fast_in_one_line(tmp_path):
    """Offline (or for an id the hub does not know) transformers retries for about a minute: checked first."""
    done = run_cli("--out", str(tmp_path / "o.jsonl"), "--device", "cpu", "--model", "no-such-org/no-such-model",
                   timeout=30)
    assert_one_line_error(done, "--model no-such-org/no-such-model: not a local folder, not in the Hugging Face cache")
    assert not (tmp_path / "o.jsonl").exists()


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vllm is installed")
def test_the_vllm_backend_without_vllm_is_a_one_line_error(tmp_path):
    done = run_cli("--out", str(tmp_path / "o.jsonl"), "--device", "cpu", "--backend", "vllm")
    assert_one_line_error(done, "--backend vllm: vLLM is not installed")


@pytest.mark.parametrize("content, message", [
    ("{not json\n", "o.jsonl:1: not JSON"),
    ('{"task": "level1/7_ReLU", "code": "x", "status": "correct"}\n', "o.jsonl:1: not a generate.py trajectory"),
])
@pytest.mark.slow
def test_an_out_that_is_not_a_trajectory_file_is_a_one_line_error(tmp_path, content, message):
    (tmp_path / "o.jsonl").write_text(content)
    assert_one_line_error(run_cli("--out", str(tmp_path / "o.jsonl"), "--device", "cpu"), message)
    assert (tmp_path / "o.jsonl").read_text() == content


def test_an_out_that_is_a_folder_is_a_one_line_error(tmp_path):
    assert_one_line_error(run_cli("--out", str(tmp_path), "--device", "cpu"), f"--out {tmp_path} is a folder")


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason="checks a machine without a GPU")
def test_without_a_gpu_the_default_device_evaluates_cpp_on_the_cpu_and_shows_generation_progress(tmp_path):
    write_add_task(tmp_path / "tasks")
    out = tmp_path / "o.jsonl"
    done = run_cli("--tasks", str(tmp_path / "tasks"), "--out", str(out), "--n-trajectories", "1", "--turns", "1",
                   "--max-tokens", "4", timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    [record] = read_records(out)
    assert "cpp_sources` only" in record["turns"][0]["prompt"]["messages"][0]["content"]
    assert "generate (batch of 1)" in done.stderr and "token" in done.stderr  # the bar over reply tokens


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks a machine without a GPU")
def test_device_cuda_without_a_gpu_stops_before_generating_anything(tmp_path):
    write_add_task(tmp_path / "tasks")
    done = run_cli("--tasks", str(tmp_path / "tasks"), "--out", str(tmp_path / "o.jsonl"), "--device", "cuda")
    assert_one_line_error(done, "--device cuda, but no CUDA GPU is visible")
    assert "rollouts" not in done.stderr and not (tmp_path / "o.jsonl").exists()


@pytest.mark.slow
@pytest.mark.parametrize("out", ["-", "/dev/stdout"])
def test_out_to_stdout_pipes_into_reward(tmp_path, out):
    """The README's chain as a real pipeline: JSONL on stdout, progress and the table on stderr."""
    write_add_task(tmp_path / "tasks")
    gen = subprocess.Popen([sys.executable, str(ROOT / "generate.py"), "--tasks", str(tmp_path / "tasks"), "--out", out,
                            "--n-trajectories", "2", "--turns", "2", "--max-tokens", "4", "--device", "cpu"],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path)
    rewarded = subprocess.run([sys.executable, str(ROOT / "reward.py"), "-"], stdin=gen.stdout, capture_output=True,
                              text=True, timeout=300)
    gen.stdout.close()
    assert gen.wait(timeout=60) == 0, gen.stderr.read()[-3000:]
    assert "mean speedup of correct" in gen.stderr.read()
    assert rewarded.returncode == 0, rewarded.stderr
    records = [json.loads(line) for line in rewarded.stdout.splitlines()]
    assert [(r["trajectory"], len(r["turns"])) for r in records] == [(0, 2), (1, 2)]
    assert all("advantage" in turn for r in records for turn in r["turns"])
    assert list(tmp_path.iterdir()) == [tmp_path / "tasks"]  # no file named "-"


def test_split_help_names_the_splits_of_split_json():
    splits = json.loads((ROOT / "tasks" / "split.json").read_text())
    help_text = " ".join(run_cli("--help").stdout.split())
    assert f"tasks/split.json ({', '.join(splits)})" in help_text


def test_a_split_name_selects_that_split_of_the_shipped_tasks():
    splits = json.loads((ROOT / "tasks" / "split.json").read_text())
    name = next(iter(splits))
    assert [t.id for t in load_tasks(name, None)] == splits[name]
    assert [t.id for t in load_tasks(str(ROOT / "tasks"), name)] == splits[name]
