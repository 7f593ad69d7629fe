"""How faithfully evaluate.py judges: races inside the tolerance, the two rule profiles (kevin, kernelbench),
tolerances per dtype, and wrong weights told apart from a wrong kernel.

Real builds of C++ candidates through the real command line on the CPU; on a GPU, the hand-written tiled GEMMs
(tests/adversarial/cuda, solutions/cuda): one missing its second barrier, one with both, one adding split-K
partial sums with atomicAdd."""
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from kevin import evaluator as ev

from kevin.eval_records import library_records

from kevin.static_rules import rejection, static_check
import generate
from kevin import prompts
from kevin import judge_checks as checks
from kevin.backends import Reply
from kevin.static_rules import RULE_PROFILES
from kevin import runner

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
import profiles  # noqa: E402

LINEAR_TASK = '''
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, in_features, out_features):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)

    def forward(self, x):
        return torch.relu(self.linear(x))


def get_inputs():
    return [torch.randn(128, 64)]


def get_init_inputs():
    return [64, 32]
'''

# The hand-written C++ ReLU's module up to its ModelNew: its extension, built once for it and for these.
RELU_LOOP = (ROOT / "solutions" / "cpu" / "level1" / "7_ReLU.correct_loop.py").read_text()
RELU_SOURCE = RELU_LOOP[:RELU_LOOP.index("class ModelNew")]

# nn.Linear kept for the heavy op, the cheap ReLU in C++: what KernelBench allows and the paper does not.
KEEPS_LINEAR = RELU_SOURCE + '''

class ModelNew(torch.nn.Module):
    def __init__(self, in_features, out_features):
        super().__init__()
        self.linear = torch.nn.Linear(in_features, out_features)

    def forward(self, x):
        return relu_ext.relu(self.linear(x).contiguous())
'''

# The same with a fallback to PyTorch should the kernel fail: rejected by both profiles.
FALLS_BACK = KEEPS_LINEAR.replace("        return relu_ext.relu(self.linear(x).contiguous())",
                                  '''        y = self.linear(x)
        try:
            return relu_ext.relu(y.contiguous())
        except RuntimeError:
            return torch.relu(y)''')

# The whole layer in C++, right, but its weights drawn with randn instead of nn.Linear's init calls.
OWN_LINEAR_OTHER_INIT = '''
import torch
from torch.utils.cpp_extension import load_inline

source = """
torch::Tensor linear_relu(torch::Tensor x, torch::Tensor w, torch::Tensor b) {
    const int64_t n = x.size(0), k = x.size(1), m = w.size(0);
    auto out = torch::empty({n, m}, x.options());
    const float* px = x.data_ptr<float>();
    const float* pw = w.data_ptr<float>();
    const float* pb = b.data_ptr<float>();
    float* po = out.data_ptr<float>();
    for (int64_t i = 0; i < n; ++i)
        for (int64_t j = 0; j < m; ++j) {
            float acc = pb[j];
            for (int64_t t = 0; t < k; ++t) acc += px[i * k + t] * pw[j * k + t];
            po[i * m + j] = acc > 0.f ? acc : 0.f;
        }
    return out;
}
"""
ext = load_inline(name="judging_linear_relu", cpp_sources=source, functions=["linear_relu"])


class ModelNew(torch.nn.Module):
    def __init__(self, in_features, out_features):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(out_features, in_features) * 0.1)
        self.bias = torch.nn.Parameter(torch.zeros(out_features))

    def forward(self, x):
        return ext.linear_relu(x.contiguous(), self.weight.contiguous(), self.bias.contiguous())
'''


def run_cli(*args):
    return subprocess.run([sys.executable, str(ROOT / "evaluate.py"), *args, "--device", "cpu", "--no-progress",
                           "--timing-budget-s", "0.5", "--run-timeout-s", "60",
                           "--tasks", str(ROOT / "tests" / "tasks")],
                          text=True, capture_output=True, cwd=ROOT, timeout=600)


@pytest.fixture(scope="module")
def cpu_profiles(tmp_path_factory):
    """The C++ candidates above, a race-like drift inside the tolerance and an honest ReLU, through the command
    line under each profile, and the candidate with other weights again with --copy-parameters."""
    folder = tmp_path_factory.mktemp("judging")
    task = folder / "1_Linear_ReLU.py"
    task.write_text(LINEAR_TASK)
    library = {r["solution"]: r for r in library_records(ROOT / "tests" / "adversarial" / "cpu")}
    solutions = {r["solution"]: r for r in library_records(ROOT / "solutions" / "cpu")}
    records = {"keeps_linear": {"task": str(task), "code": KEEPS_LINEAR},
               "falls_back": {"task": str(task), "code": FALLS_BACK},
               "other_init": {"task": str(task), "code": OWN_LINEAR_OTHER_INIT},
               "drifts": library["level1/7_ReLU.rejected_nondeterministic"],
               "honest": solutions["level1/7_ReLU.correct_loop"], "leaky": solutions["level1/7_ReLU.incorrect_leaky"]}
    (folder / "in.jsonl").write_text("".join(json.dumps({**r, "name": n}) + "\n" for n, r in records.items()))
    results = {}
    for name, flags in (("kevin", []), ("kernelbench", ["--rules", "kernelbench"]), ("copied", ["--copy-parameters"])):
        done = run_cli(str(folder / "in.jsonl"), *flags)
        assert done.returncode == 0, done.stderr
        results[name] = {row["name"]: row["eval"] for row in map(json.loads, done.stdout.splitlines())}
    return results


@pytest.mark.slow
def test_kernelbench_rules_allow_a_kept_torch_layer_that_the_papers_reject(cpu_profiles):
    kevin, kernelbench = cpu_profiles["kevin"]["keeps_linear"], cpu_profiles["kernelbench"]["keeps_linear"]
    assert kevin["status"] == "rejected" and "[torch-nn-layer]" in kevin["feedback"]
    assert "Rejected by Kevin's rules" in kevin["feedback"] and kevin["rules"] == "kevin"
    assert kernelbench["status"] == "correct", kernelbench["feedback"]
    assert kernelbench["rules"] == "kernelbench" and kernelbench["max_abs_diff"] <= 1e-4


def test_a_try_except_fallback_is_rejected_by_both_profiles(cpu_profiles):
    for profile, name in (("kevin", "Kevin's rules"), ("kernelbench", "KernelBench's rules")):
        e = cpu_profiles[profile]["falls_back"]
        assert e["status"] == "rejected" and "[try-except]" in e["feedback"] and name in e["feedback"], e["feedback"]


@pytest.mark.slow
def test_a_drift_inside_the_tolerance_is_a_race_and_an_honest_kernel_still_passes(cpu_profiles):
    for profile in ("kevin", "kernelbench"):
        drifts, honest = cpu_profiles[profile]["drifts"], cpu_profiles[profile]["honest"]
        assert drifts["status"] == "rejected" and "[nondeterministic] run 2" in drifts["feedback"], drifts["feedback"]
        assert honest["status"] == "correct" and honest["max_abs_diff"] == 0.0, honest["feedback"]


def test_wrong_weights_are_told_apart_from_a_wrong_kernel_and_copying_them_judges_the_kernel(cpu_profiles):
    for profile in ("kevin", "kernelbench"):
        e = cpu_profiles[profile]["other_init"]
        assert e["status"] == "incorrect" and ev.WEIGHTS_DIFFER in e["feedback"], e["feedback"]
        assert e["max_rel_diff"] > 1e-2
    copied = cpu_profiles["copied"]["other_init"]
    assert copied["status"] == "correct", copied["feedback"]


def test_a_wrong_kernel_is_not_blamed_on_its_weights(cpu_profiles):
    """A leaky ReLU has no parameters to copy: its feedback says how far off it is, and nothing of weights."""
    e = cpu_profiles["kevin"]["leaky"]
    assert e["status"] == "incorrect" and ev.WEIGHTS_DIFFER not in e["feedback"] and "max relative" in e["feedback"]


def taken(*outputs) -> list[dict]:
    """Outputs as the judge takes them from the runner: a tensor's description and its copy, or what came instead."""
    return [{"shape": list(o.shape), "dtype": str(o.dtype).removeprefix("torch."), "value": o}
            if isinstance(o, torch.Tensor) else {"type": type(o).__name__} for o in outputs]


def test_kernelbench_tolerances_are_per_dtype_and_the_flags_override_them():
    assert ev.tolerances(ev.EvalConfig()) == {d: [1e-2, 1e-2] for d in ("float32", "float16", "bfloat16", "other")}
    strict = ev.tolerances(ev.EvalConfig(rules="kernelbench"))
    assert strict["float32"] == [1e-4, 1e-4] and strict["bfloat16"] == strict["float16"] == [1e-2, 1e-2]
    assert ev.tolerances(ev.EvalConfig(rules="kernelbench", atol=1e-3))["float32"] == [1e-3, 1e-4]
    ref = torch.full((4,), 100.0)
    assert checks.compare(taken(ref + 5e-3), ref, strict)[0] is None  # 5e-5 relative: inside 1e-4
    status, why, abs_diff, rel_diff = checks.compare(taken(ref * 1.001), ref, strict)
    assert status == "incorrect" and "rtol=0.0001" in why
    assert abs_diff == pytest.approx(0.1, rel=1e-3) and rel_diff == pytest.approx(1e-3, rel=1e-3)
    assert checks.compare(taken((ref * 1.001).half()), ref.half(), strict)[0] is None  # fp16: 1e-2


def test_repeats_allow_atomic_jitter_and_catch_a_race_inside_the_tolerance():
    torch.manual_seed(0)
    first = torch.randn(256, 256) * 100
    assert checks.repeat_disagrees(taken(first), taken(first.clone()), 1e-5) is None
    jitter = first + first.abs().max() * 1e-7 * torch.randn_like(first)  # atomics adding in another order
    assert checks.repeat_disagrees(taken(first), taken(jitter), 1e-5) is None
    race = first.clone()
    race.view(-1)[first.abs().argmax()] += 1.0  # a product with a wrong operand: ~1e-3 off, inside atol = rtol = 1e-2
    assert checks.compare(taken(race), first, ev.tolerances(ev.EvalConfig()))[0] is None
    assert "differs from the first by up to 1" in checks.repeat_disagrees(taken(first), taken(race), 1e-5)
    bf16 = first.bfloat16()
    assert checks.repeat_disagrees(taken(bf16), taken(bf16 * (1 + 2 ** -8)), 1e-5) is None  # 4 epsilons allowed
    assert "values that changed" in checks.repeat_disagrees(taken(torch.arange(4)), taken(torch.tensor([0, 1, 2, 4])),
                                                            1e-5)
    assert checks.repeat_disagrees(taken(first, 3), taken(first.clone(), 3), 1e-5) is None  # left to the reference
    assert "returned 1 outputs instead of 2" in checks.repeat_disagrees(taken(first, first), taken(first), 1e-5)


def test_kernelbench_static_rules_allow_torch_but_not_fallbacks_threads_or_subclassing():
    base = KEEPS_LINEAR.replace("self.linear(x).contiguous()", "torch.nn.functional.gelu(x)")
    assert static_check(base, "cpu", "kevin")[0] == "rejected"
    assert static_check(base, "cpu", "kernelbench") is None
    skip = "        if x is None:\n            pass\n"
    for change, rule in ((("        return relu_ext", skip + "        return relu_ext"), "[pass]"),
                         (("import torch\n", "import torch\nimport threading\n"), "[threads]"),
                         (("class ModelNew(torch.nn.Module)", "class ModelNew(Model)"), "[subclass-reference]")):
        status, feedback = static_check(base.replace(*change), "cpu", "kernelbench")
        assert status == "rejected" and rule in feedback and "KernelBench's rules" in feedback, feedback


def test_copy_parameters_copies_only_shapes_that_match_once_on_each_side():
    torch.manual_seed(0)
    reference = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 3), torch.nn.Linear(3, 3))
    candidate = torch.nn.Module()
    candidate.w = torch.nn.Parameter(torch.zeros(3, 4))
    candidate.square = torch.nn.Parameter(torch.zeros(3, 3))  # three (3, 3) weights to choose from: ambiguous
    assert runner.copy_parameters(reference, candidate) == 1
    assert torch.equal(candidate.w, reference[0].weight) and not candidate.square.any()


def test_the_prompt_states_the_rules_that_judge_and_how_parameters_must_be_made():
    kevin = prompts.render_prompt("class Model: pass\n", [], True, "cuda")[0]["content"]
    kernelbench = prompts.render_prompt("class Model: pass\n", [], True, "cpu", "kernelbench")[0]["content"]
    own, theirs = RULE_PROFILES["kevin"].prompt_line, RULE_PROFILES["kernelbench"].prompt_line
    assert own in kevin and theirs not in kevin
    assert theirs in kernelbench and own not in kernelbench
    assert prompts.PARAMETERS_RULE in kevin and prompts.PARAMETERS_RULE in kernelbench


def test_generate_passes_its_rules_to_the_evaluator_and_the_prompt(tmp_path):
    class NoCode:
        prompts = []

        def prompt_token_ids(self, messages):
            return None

        def count_tokens(self, messages):
            return 0

        def generate(self, prompts, seeds):
            self.prompts += prompts
            return [Reply("no code", None, None) for _ in prompts]

    (tmp_path / "tasks" / "level1").mkdir(parents=True)
    (tmp_path / "tasks" / "level1" / "1_Linear_ReLU.py").write_text(LINEAR_TASK)
    out, backend = tmp_path / "out.jsonl", NoCode()
    generate.main(["--tasks", str(tmp_path / "tasks"), "--out", str(out), "--n-trajectories", "1", "--turns", "1",
                   "--device", "cpu", "--rules", "kernelbench"], backend=backend)
    [turn] = json.loads(out.read_text())["turns"]
    assert turn["eval"]["rules"] == "kernelbench" and turn["eval"]["status"] == "format_error"
    assert RULE_PROFILES["kernelbench"].prompt_line in backend.prompts[0][0]["content"]


def test_train_and_generate_take_the_rules_flag_with_the_papers_as_default():
    import train

    assert train.parse_args([]).rules == generate.parse_args(["--out", "x"]).rules == ev.EvalConfig().rules == "kevin"
    assert train.parse_args(["--rules", "kernelbench"]).rules == "kernelbench"


def test_a_bad_rules_flag_is_one_clear_line(tmp_path):
    (tmp_path / "in.jsonl").write_text(json.dumps({"task": "level1/7_ReLU", "code": "no code"}) + "\n")
    done = run_cli(str(tmp_path / "in.jsonl"), "--rules", "loose")
    assert done.returncode != 0 and "error: --rules must be one of kevin, kernelbench, got loose" in done.stderr
    assert "Traceback" not in done.stderr


def test_the_profile_table_names_each_profiles_status_and_rule():
    kept = ev.make_result("rejected", rejection("kevin", ["[torch-nn-layer] line 9: torch.nn.Linear"]))
    verdicts = {"kevin": {"verdict": profiles.verdict(kept)},
                "kernelbench": {"verdict": profiles.verdict(ev.make_result("correct", "ok"))}}
    report = {"device": "CPU", "rows": [{"candidate": "tests/x.py", **verdicts}]}
    assert profiles.render(report).splitlines()[-1] == "| tests/x.py | rejected [torch-nn-layer] | correct |"


# --------------------------------------------------------------------------------------------------- GPU

def matmul_records() -> list[dict]:
    """The three tiled GEMMs for level1/1_Square_Matmul: the racy one, both barriers, split-K with atomicAdd."""
    files = sorted((ROOT / "tests" / "adversarial" / "cuda" / "level1").glob("1_Square_Matmul.*.py")) + \
        sorted((ROOT / "solutions" / "cuda" / "level1").glob("1_Square_Matmul.*.py"))
    return [{"task": "level1/1_Square_Matmul", "code": f.read_text(), "solution": f.stem} for f in files]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("rules", ["kevin", "kernelbench"])
def test_a_gemm_missing_its_second_barrier_is_a_race_and_the_honest_gemms_pass(tmp_path, rules):
    """Through the command line: the race is rejected as nondeterministic under either rules (its repeated
    runs differ by ~1 on outputs of ~100; the repeat check comes before the reference's tolerance), the
    kernel with both barriers repeats bit for bit, and the split-K one's atomicAdd jitter stays inside the
    repeat tolerance. The honest ones are correct under the paper's tolerance; under KernelBench's fp32
    tolerance (1e-4) an fp32 GEMM of K = 4096 summed in another order than cuBLAS's may be incorrect (on the
    H200 ~1e-3 apart on a few thousand of 16.7M outputs), as KernelBench itself would judge it."""
    records = matmul_records()
    assert len(records) == 3
    (tmp_path / "in.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    done = subprocess.run([sys.executable, str(ROOT / "evaluate.py"), str(tmp_path / "in.jsonl"), "--rules", rules,
                           "--no-progress", "--device", "cuda", "--gpus", "0"],
                          text=True, capture_output=True, cwd=ROOT, timeout=900)
    assert done.returncode == 0, done.stderr
    got = {row["solution"]: row["eval"] for row in map(json.loads, done.stdout.splitlines())}
    race = got["1_Square_Matmul.rejected_nondeterministic"]
    assert race["status"] == "rejected" and "[nondeterministic]" in race["feedback"], race["feedback"]
    for name in ("1_Square_Matmul.correct_tiled", "1_Square_Matmul.correct_split_k_atomic"):
        honest = got[name]
        if rules == "kevin":
            assert honest["status"] == "correct", honest["feedback"]
        else:
            assert honest["status"] in ("correct", "incorrect"), honest["feedback"]
            assert honest["status"] == "correct" or "atol=0.0001" in honest["feedback"], honest["feedback"]
        assert "[nondeterministic]" not in honest["feedback"]
