"""warm_start.py: the variant library, the prompt -> reply pairs it makes, and a short fine-tune that memorises."""
import json
import random
import re
import shutil
from pathlib import Path

import pytest

import evaluate
import warm_start as ws
from generate import load_tasks, parse_reply

ROOT = Path(__file__).resolve().parents[1]
LIBRARIES = {"cuda": ROOT / "solutions" / "warm_start" / "cuda", "cpu": ROOT / "solutions" / "warm_start" / "cpu"}


@pytest.mark.parametrize("device", ["cuda", "cpu"])
def test_every_library_reply_parses_back_into_its_code_and_summary(device):
    variants = ws.load_library(LIBRARIES[device])
    assert len(variants) >= 8
    for v in variants:
        assert parse_reply(v["reply"]) == (v["code"], v["summary"]), v["variant"]
        assert not v["code"].startswith('"""'), v["variant"]  # the docstring became the summary


@pytest.mark.parametrize("device", ["cuda", "cpu"])
def test_library_has_every_kind_of_variant_for_every_task_and_breaks_no_static_rule(device):
    variants = ws.load_library(LIBRARIES[device])
    tasks = {task.id for task in load_tasks(str(ws.DEFAULT_TASKS[device]), None)}
    for task in {v["task"] for v in variants}:
        assert task in tasks
        statuses = sorted(ws.expected_status(v["variant"]) for v in variants if v["task"] == task)
        assert statuses == ["compile_error", "correct", "correct", "incorrect"], task
    for v in variants:
        assert evaluate.static_check(v["code"], device) is None, v["variant"]


@pytest.mark.parametrize("device", ["cuda", "cpu"])
def test_variants_of_a_task_differ_from_its_fast_one_by_one_line(device):
    """Few branch points, so that a policy that memorised the library rarely mixes two variants into a new kernel."""
    variants = ws.load_library(LIBRARIES[device])
    for v in variants:
        fast = next(f for f in variants if f["task"] == v["task"] and f["variant"].split(".")[1] in
                    ("correct_vec4", "correct_vectorised"))
        changed = set(v["code"].splitlines()) ^ set(fast["code"].splitlines())
        assert len(changed) <= 2, (v["variant"], changed)  # one line changed (2 in the difference) or added (1)


def scored(*scores: float) -> list[dict]:
    return [{"variant": f"v{i}", "reply": f"reply {i}", "code": f"code {i}\n", "summary": f"summary {i}",
             "score": s, "eval": {"feedback": f"feedback of v{i}"}} for i, s in enumerate(scores)]


def test_a_refiner_never_repeats_a_failure_and_never_falls_below_its_last_attempt():
    compile_error, incorrect, slow, fast = variants = scored(0.0, 0.0, 0.4, 1.2)
    assert ws.next_variants(variants, compile_error) == [incorrect, slow, fast]
    assert ws.next_variants(variants, slow) == [slow, fast]
    assert ws.next_variants(variants, fast) == [fast]


def test_later_turn_prompts_quote_each_attempt_with_its_feedback_and_reply_with_an_allowed_variant():
    variants = scored(0.0, 0.0, 0.4, 1.2)
    examples = ws.sft_examples("class Model: ...\n", variants, turns=3, paths=6, device="cpu", rng=random.Random(0))
    assert sorted(e["reply"] for e in examples if e["turn"] == 1) == sorted(v["reply"] for v in variants)
    later = [e for e in examples if e["turn"] > 1]
    assert later and max(e["turn"] for e in later) == 3  # turns numbered from 1, as generate.py numbers them
    for e in later:
        prompt = e["messages"][0]["content"]
        assert prompt.count("### Attempt") == e["turn"] - 1
        assert "### Attempt 1\n" in prompt and f"### Attempt {e['turn'] - 1}\n" in prompt
        last = max(variants, key=lambda v: prompt.rfind(v["code"]))  # the attempt quoted last
        assert f"Feedback: {last['eval']['feedback']}" in prompt
        assert e["reply"] in [v["reply"] for v in ws.next_variants(variants, last)]


def test_quoted_feedback_keeps_its_words_and_changes_its_timings():
    feedback = "Correct. Your kernel runs in 0.5067 ms against 0.04464 ms: a speedup of 0.09x. main.cpp:3:10"
    jittered = ws.jitter_numbers(feedback, random.Random(0))
    assert jittered != feedback
    assert re.sub(r"\d", "#", jittered) == re.sub(r"\d", "#", feedback)  # same words, same number of digits
    assert jittered.endswith("main.cpp:3:10")  # line numbers are not timings


@pytest.mark.slow
def test_a_short_fine_tune_makes_the_greedy_reply_a_library_kernel(tmp_path):
    """One C++ variant, turn-1 prompts only (no evaluation needed): the model must write it back word for word."""
    library = tmp_path / "library" / "level1"
    library.mkdir(parents=True)
    shutil.copy(LIBRARIES["cpu"] / "level1" / "7_ReLU.correct_vectorised.py", library)
    ws.main(["--device", "cpu", "--library", str(library.parent), "--turns", "1", "--layers", "1", "--hidden", "256",
             "--epochs", "100", "--batch-size", "1", "--lr", "3e-3", "--check-samples", "0",
             "--out", str(tmp_path / "model")])
    report = json.loads((tmp_path / "model" / "warm_start.json").read_text())
    assert report["greedy_is_library"] == {"level1/7_ReLU turn 1": True}
    assert report["loss_per_epoch"][-1] < 0.05 * report["loss_per_epoch"][0]
    from transformers import AutoModelForCausalLM, AutoTokenizer  # what train.py --model loads

    assert AutoModelForCausalLM.from_pretrained(tmp_path / "model").config.num_hidden_layers == 1
    assert AutoTokenizer.from_pretrained(tmp_path / "model").eos_token == "<|im_end|>"


def test_every_phase_shows_progress_on_stderr(tmp_path, capsys):
    """A default run takes many minutes: each phase says what it does, training and generation show bars."""
    library = tmp_path / "library" / "level1"
    library.mkdir(parents=True)
    shutil.copy(LIBRARIES["cpu"] / "level1" / "7_ReLU.correct_vectorised.py", library)
    ws.main(["--device", "cpu", "--library", str(library.parent), "--turns", "1", "--layers", "1", "--hidden", "64",
             "--epochs", "2", "--check-samples", "2", "--out", str(tmp_path / "model")])
    err = capsys.readouterr().err
    phases = ["1 examples from 1 variants; fine-tuning tiny for 2 epochs", "warm start", "epoch=2/2",
              "check: greedy replies to 1 prompts", "check: 2 sampled replies to each of 1 prompts", "token"]
    assert all(phase in err for phase in phases), err[-2000:]
    order = [err.index(phases[0]), err.index(phases[3]), err.index(phases[4])]
    assert order == sorted(order)
