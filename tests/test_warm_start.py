"""warm_start.py: the variant library, the prompt -> reply pairs it makes, and a short fine-tune that memorises."""
import json
import os
import random
import re
import shutil
import signal
import sys
import time
from pathlib import Path

import pytest
import torch

from kevin.static_rules import static_check
import warm_start as ws
from kevin import warm_policy
from kevin.prompts import parse_reply
from kevin.tasks import load_tasks
from kevin import config_flags
from test_evaluate import ctrl_c_while_torch_loads, start_for_ctrl_c

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
    tasks = {task.id for task in load_tasks(str(warm_policy.DEFAULT_TASKS[device]), None)}
    for task in {v["task"] for v in variants}:
        assert task in tasks
        statuses = sorted(ws.expected_status(v["variant"]) for v in variants if v["task"] == task)
        assert statuses == ["compile_error", "correct", "correct", "incorrect"], task
    for v in variants:
        assert static_check(v["code"], device) is None, v["variant"]


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
def test_a_library_whose_correct_variants_all_fail_is_a_one_line_error_not_a_policy_taught_that_all_fail():
    """On the H200 every child once failed to enter its sandbox, every variant was judged compile_error, and the
    warm start went on with warnings, teaching the policy that nothing compiles. Here each variant's module
    raises as it is imported, as a module that cannot be loaded there did."""
    from accelerate import Accelerator

    variants = [{**v, "code": v["code"].replace("import torch\n", 'import torch\nraise OSError("unshare failed")\n', 1)}
                for v in ws.load_library(LIBRARIES["cpu"])]
    assert all("unshare" in v["code"] for v in variants)
    with pytest.raises(SystemExit) as stop:
        ws.judge_library(variants, ROOT / "tests" / "tasks", "cpu", 2, Accelerator(cpu=True))
    message = str(stop.value)
    assert message.startswith("error: none of the library's") and "\n" not in message, message
    assert "judged correct on cpu" in message and "unshare failed" in message


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


def test_ctrl_c_while_torch_imports_is_one_line(tmp_path):
    returncode, stderr = ctrl_c_while_torch_loads([sys.executable, str(ROOT / "warm_start.py"), "--out",
                                                   str(tmp_path / "model")])
    assert returncode == 130 and stderr.splitlines() == ["interrupted: while starting, before training"], stderr
    assert not (tmp_path / "model").exists()


def short_library(folder: Path) -> Path:
    """Three variants of a few tokens (never evaluated with --turns 1): three steps an epoch, and a quick check."""
    (folder / "level1").mkdir(parents=True)
    for name in ("correct_a", "correct_b", "incorrect_c"):
        (folder / "level1" / f"7_ReLU.{name}.py").write_text(f'"""Variant {name}."""\nx = "{name}"\n')
    return folder


@pytest.mark.slow
def test_ctrl_c_saves_the_step_under_way_and_a_rerun_resumes_to_an_uninterrupted_runs_result(tmp_path, capsys):
    """Ctrl-C to the whole foreground group once the first checkpoint is saved: the step under way ends and is saved,
    and the one line says which; a re-run with the same --out goes on from it and ends with the losses of a run never
    interrupted (the same model, optimizer and batches: a fresh optimizer or another order would change them)."""
    flags = ["--device", "cpu", "--library", str(short_library(tmp_path / "library")), "--turns", "1", "--layers", "1",
             "--hidden", "64", "--epochs", "2", "--batch-size", "1", "--check-samples", "0", "--save-every", "2"]
    out = tmp_path / "model"
    checkpoint = out / warm_policy.CHECKPOINT
    proc = start_for_ctrl_c([sys.executable, str(ROOT / "warm_start.py"), *flags, "--out", str(out)])
    deadline = time.monotonic() + 300
    while not checkpoint.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGINT)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130 and "Traceback" not in stderr, stderr[-3000:]
    step = len(torch.load(checkpoint, weights_only=True)["losses"])
    assert stderr.splitlines()[-1] == (f"interrupted: step {step} of 6 saved in {checkpoint}; re-run with the same "
                                       "--out to resume"), stderr[-3000:]
    assert 2 <= step <= 6 and not (out / "warm_start.json").exists()

    capsys.readouterr()
    ws.main([*flags, "--out", str(out)])
    assert f"resuming from {checkpoint} at step {step} of 6" in capsys.readouterr().err
    assert not checkpoint.exists()  # the run is done
    ws.main([*flags, "--out", str(tmp_path / "uninterrupted")])
    resumed, uninterrupted = (json.loads((tmp_path / run / "warm_start.json").read_text())["loss_per_epoch"]
                              for run in ("model", "uninterrupted"))
    assert resumed == pytest.approx(uninterrupted, rel=1e-6, abs=0)


def test_a_checkpoint_of_other_training_flags_is_a_one_line_error(tmp_path):
    """Resuming it would train on with another schedule or model; the check's and the output's flags may change."""
    saved = ws.parse_args(["--device", "cpu", "--epochs", "3", "--out", str(tmp_path)])
    torch.save({"flags": warm_policy.training_flags(saved), "losses": [1.0]}, tmp_path / warm_policy.CHECKPOINT)
    with pytest.raises(SystemExit, match=f"error: --out {tmp_path} holds an interrupted run with --epochs 3; give its"):
        ws.load_checkpoint(ws.parse_args(["--device", "cpu", "--epochs", "4", "--out", str(tmp_path)]))
    same = ws.parse_args(["--device", "cpu", "--epochs", "3", "--check-samples", "2", "--save-every", "9",
                          "--out", str(tmp_path)])
    assert ws.load_checkpoint(same)["losses"] == [1.0]


def test_every_config_field_is_a_flag_with_its_docstring_as_help(monkeypatch):
    """Defaults that hang on the device are resolved from it; a bad value is a one-line error."""
    monkeypatch.setenv("COLUMNS", "1000")  # no line breaks in the help, at hyphens or elsewhere
    help_text = ws._parser().format_help()
    for name, doc in config_flags.field_docs(warm_policy.WarmStartConfig).items():
        assert doc in help_text, name
    cfg = ws.parse_args(["--device", "cpu", "--batch-size", "2", "--lr", "1e-3", "--out", "o"])
    assert cfg == warm_policy.WarmStartConfig(device="cpu", library=LIBRARIES["cpu"], batch_size=2, lr=1e-3, out="o")
    assert cfg.tasks == warm_policy.DEFAULT_TASKS["cpu"]
    with pytest.raises(SystemExit, match="^error: --batch-size must be at least 1, got 0$"):
        ws.parse_args(["--device", "cpu", "--batch-size", "0", "--out", "o"])


# ---------------------------------------------------------------- the policy train.py starts from
@pytest.mark.parametrize("device", ["cuda", "cpu"])
def test_held_out_tasks_are_in_no_warm_start_example(device):
    """No library variant names a held-out task, and none is a training task under another name."""
    held_out = load_tasks(str(warm_policy.HELDOUT_TASKS[device]), None)
    trained = load_tasks(str(warm_policy.DEFAULT_TASKS[device]), None)
    assert held_out and {t.id for t in held_out}.isdisjoint({v["task"] for v in ws.load_library(LIBRARIES[device])})
    assert {t.source for t in held_out}.isdisjoint({t.source for t in trained})


def test_the_policy_key_changes_with_a_setting_or_a_library_file_and_with_nothing_else(tmp_path):
    library = tmp_path / "library"
    shutil.copytree(LIBRARIES["cpu"], library)
    config = warm_policy.WarmStartConfig(device="cpu", library=library, out="a", **warm_policy.POLICY_SETTINGS)
    key = warm_policy.policy_key(config)
    assert key.startswith("cpu-2x128-")
    assert warm_policy.policy_key(warm_policy.WarmStartConfig(device="cpu", library=library, out="b", check_samples=3,
                                            **warm_policy.POLICY_SETTINGS)) == key  # where it goes and its check: no matter
    assert warm_policy.policy_key(warm_policy.WarmStartConfig(device="cpu", library=library, out="a",
                                            **{**warm_policy.POLICY_SETTINGS, "epochs": 41})) != key
    variant = next(library.rglob("*.py"))
    variant.write_text(variant.read_text() + "\n")
    assert warm_policy.policy_key(config) != key


def test_the_policy_is_made_once_then_taken_from_its_cache(tmp_path, monkeypatch):
    made = []

    def fake_make(config, key, folder):
        made.append(key)
        folder.mkdir(parents=True)
        (folder / "config.json").write_text("{}")
        (folder / "policy.json").write_text(json.dumps({"key": key}))

    monkeypatch.setattr(warm_policy, "CACHE", tmp_path / "cache")
    monkeypatch.setattr(warm_policy, "SHIPPED", tmp_path / "shipped")  # none shipped
    monkeypatch.setattr(warm_policy, "make_policy", fake_make)
    first = warm_policy.policy("cpu")
    assert first.parent == tmp_path / "cache" and first.name == made[0]
    assert warm_policy.policy("cpu") == first and len(made) == 1
    assert warm_policy.policy("cpu", epochs=2) != first and len(made) == 2  # other settings: another policy


@pytest.mark.slow
def test_a_missing_policy_is_made_by_warm_start_py_into_the_cache_and_names_no_folder_of_the_machine(tmp_path,
                                                                                                     monkeypatch):
    """One variant, turn-1 examples only, one epoch of a 1 x 64 model: the real subprocess, seconds."""
    library = tmp_path / "library" / "level1"
    library.mkdir(parents=True)
    shutil.copy(LIBRARIES["cpu"] / "level1" / "7_ReLU.correct_vectorised.py", library)
    monkeypatch.setattr(warm_policy, "CACHE", tmp_path / "cache")
    settings = {"library": library.parent, "turns": 1, "epochs": 1, "layers": 1, "hidden": 64, "batch_size": 1}
    made = warm_policy.policy("cpu", **settings)
    assert made.parent == tmp_path / "cache" and (made / "model.safetensors").exists()
    marker = json.loads((made / "policy.json").read_text())
    assert marker["key"] == made.name and marker["settings"]["tasks"] == "tests/tasks"
    assert not list((tmp_path / "cache").glob("*.partial"))
    stamp = (made / "policy.json").stat().st_mtime_ns
    assert warm_policy.policy("cpu", **settings) == made and (made / "policy.json").stat().st_mtime_ns == stamp


def test_the_shipped_cpu_policy_is_small_loads_and_is_the_one_the_library_asks_for():
    """A fresh clone's `python train.py` on the CPU starts from it without training a warm start first."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    shipped = warm_policy.SHIPPED / "cpu"
    assert sum(f.stat().st_size for f in shipped.rglob("*") if f.is_file()) < 5 * 2 ** 20
    assert warm_policy.policy("cpu") == shipped  # its key is that of the library, tasks and settings of today
    model = AutoModelForCausalLM.from_pretrained(shipped)
    assert (model.config.num_hidden_layers, model.config.hidden_size) == (2, 128)
    assert AutoTokenizer.from_pretrained(shipped).eos_token == "<|im_end|>"
    report = json.loads((shipped / "warm_start.json").read_text())
    assert not any(str(v).startswith("/") for v in report["args"].values())  # names no folder of the machine


def test_a_near_miss_drops_one_non_blank_line_and_the_same_seed_draws_the_same_ones():
    code = "import torch\n\nsource = \"\"\"\nint f() { return 1; }\n\"\"\"\nclass ModelNew:\n    x = 1\n"
    misses = ws.near_misses(code, 3, random.Random("v"))
    assert misses == ws.near_misses(code, 3, random.Random("v")) and len(set(misses)) == 3
    for miss in misses:
        dropped = [line for line in code.splitlines() if line not in miss.splitlines()]
        assert len(dropped) == 1 and dropped[0].strip() and len(miss.splitlines()) == len(code.splitlines()) - 1
    assert len(ws.near_misses(code, 99, random.Random(0))) == 6  # no more than the non-blank lines


def test_after_a_near_miss_and_its_feedback_the_reply_is_the_kernel_it_came_from():
    variants = scored(0.0, 0.0, 0.4, 1.2)
    miss = {"code": "code 3 without a line\n", "summary": "summary 3", "fix": variants[3],
            "eval": {"feedback": "Compilation failed: 'y' was not declared in this scope"}}
    plain = ws.sft_examples("class Model: ...\n", variants, turns=3, paths=6, device="cpu", rng=random.Random(0))
    examples = ws.sft_examples("class Model: ...\n", variants, turns=3, paths=6, device="cpu", rng=random.Random(0),
                               misses=[miss])
    assert examples[:len(plain)] == plain  # the library's examples as without near misses
    fixes = examples[len(plain):]
    assert [e["turn"] for e in fixes] == [2, 3]  # first, and after one sampled attempt
    for e in fixes:
        prompt = e["messages"][0]["content"]
        assert prompt.rstrip().endswith(ws.render_prompt("", [], False, "cpu")[0]["content"].split("\n\n")[-1])
        assert f"### Attempt {e['turn'] - 1}\n```python\ncode 3 without a line\n```" in prompt
        assert "Feedback: Compilation failed: 'y' was not declared in this scope" in prompt
        assert e["reply"] == variants[3]["reply"]


@pytest.mark.slow
def test_near_misses_are_judged_by_the_evaluator_and_a_fix_example_quotes_its_real_feedback():
    """The first attempt of a fix example is a kernel the real evaluator judged wrong, quoted with its feedback."""
    from accelerate import Accelerator

    variants = [v for v in ws.load_library(LIBRARIES["cpu"]) if v["variant"] == "level1/7_ReLU.correct_vectorised"]
    variants[0]["eval"] = {"status": "correct", "feedback": "Correct. It can be made faster."}
    judged = ws.judge_near_misses(variants, 2, ROOT / "tests" / "tasks", "cpu", Accelerator(cpu=True))
    assert len(judged) == 2 and all(m["fix"] is variants[0] and m["code"] != variants[0]["code"] for m in judged)
    wrong = [m for m in judged if ws.is_wrong(m["eval"])]
    assert wrong, [m["eval"]["status"] for m in judged]
    task = load_tasks(str(ROOT / "tests" / "tasks"), None)[0]
    variants[0]["score"] = 1.0
    examples = ws.sft_examples(task.source, variants, 2, 1, "cpu", random.Random(0), wrong)
    assert len(examples) == 2 + len(wrong)  # the variant at turns 1 and 2, then a fix example per wrong near miss
    for miss, example in zip(wrong, examples[2:]):
        assert miss["eval"]["status"] in ("format_error", "rejected", "compile_error", "runtime_error", "incorrect")
        prompt = example["messages"][0]["content"]
        assert example["turn"] == 2 and f"```python\n{miss['code'].rstrip()}\n```" in prompt
        digits = re.compile(r"\d")  # the feedback's words as the evaluator wrote them, its numbers jittered
        assert digits.sub("#", f"Feedback: {miss['eval']['feedback']}") in digits.sub("#", prompt)
        assert example["reply"] == variants[0]["reply"]
