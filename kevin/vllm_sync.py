"""vLLM engines that generate with the policy being trained, and the push of its weights into them after every update.

- `ColocatedEngine`: one engine in every training process. Under `accelerate launch` the engines join the
  processes' own torch.distributed world (vLLM's external launcher), one engine per rank (tensor parallel
  size 1); alone, the engine is simply in-process. On a GPU it sleeps whenever it is not generating.
- `ServedEngine`: a vLLM OpenAI-compatible server started apart (other GPUs or another machine that shares
  a folder with the trainer). Prompts go in as token ids; token ids and sampling log-probs come back. The
  weights go through a safetensors file that the server reads after each update, through its development
  endpoint /collective_rpc (so it must run with VLLM_SERVER_DEV_MODE=1 and this module as its
  --worker-extension-cls).
- `policy_weights`: the policy's full weights in the checkpoint's names, one tensor at a time, gathered from
  FSDP 2 or ZeRO-3 shards (so no GPU holds a second full copy) and with LoRA adapters merged into the
  weights they adapt (exact, and vLLM needs no LoRA support).
- `sync_error`: after a push, the engine's greedy tokens and log-probs of a fixed prompt against the policy's.
"""

import json
import os
import re
import tempfile
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch
from torch.distributed.tensor import DTensor

from kevin.batching import token_logprobs
from kevin.backends import ChatTokens, Reply, VLLMBackend, post_json

SYNC_PROMPT = [{"role": "user", "content": "Write a CUDA kernel that adds two vectors."}]
SYNC_TOKENS = 16  # greedy tokens compared after each push
LORA_PART = re.compile(r"^(.*)\.(base_layer|lora_A\.default|lora_B\.default)\.weight$")


# ---------------------------------------------------------------- the policy's weights
def policy_weights(accelerator, model) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, full tensor) in the checkpoint's names, one at a time (none is kept here once the reader moves
    on, so only the reader decides how many are whole at once): every rank must read all of them, in order,
    since gathering a sharded tensor is a collective. A tied lm_head is left out (vLLM ties it)."""
    policy = accelerator.unwrap_model(model)
    config = policy.config
    weights = gathered(accelerator, policy)
    if hasattr(policy, "peft_config"):
        lora = policy.peft_config["default"]
        weights = merged_lora(weights, lora.lora_alpha / lora.r)
    for name, tensor in weights:
        if not (config.tie_word_embeddings and name == "lm_head.weight"):
            yield name, tensor
        del tensor  # else it would still be held while the next one is gathered


def gathered(accelerator, policy) -> Iterator[tuple[str, torch.Tensor]]:
    """The state dict's tensors whole: ZeRO-3 gathers one parameter at a time, FSDP 2 one DTensor at a time."""
    plugin = accelerator.state.deepspeed_plugin
    if plugin is not None and plugin.zero_stage == 3:
        import deepspeed

        for name, parameter in policy.named_parameters():
            yield name, zero3_copy(deepspeed, parameter)  # released before the reader takes it
        return
    for name, tensor in policy.state_dict().items():
        yield name, tensor.full_tensor() if isinstance(tensor, DTensor) else tensor.detach()


def merged_lora(weights: Iterator[tuple[str, torch.Tensor]], scaling: float) -> Iterator[tuple[str, torch.Tensor]]:
    """peft's names back to the base model's, each adapted weight W + scaling * B @ A (computed in float32).
    A module's parts are held only until its last one arrives."""
    pending: dict[str, dict[str, torch.Tensor]] = {}
    for name, tensor in weights:
        name = name.removeprefix("base_model.model.")
        part = LORA_PART.match(name)
        if part is None:
            yield name.replace(".base_layer.", "."), tensor
            del tensor  # else it would still be held while the next one is gathered
            continue
        module, kind = part.groups()
        pending.setdefault(module, {})[kind.split(".")[0]] = tensor
        del tensor
        if len(pending[module]) == 3:
            yield f"{module}.weight", lora_merge(**pending.pop(module), scaling=scaling)
    if pending:
        raise ValueError(f"LoRA modules without all of base, A and B: {sorted(pending)}")


def lora_merge(base_layer: torch.Tensor, lora_A: torch.Tensor, lora_B: torch.Tensor, scaling: float) -> torch.Tensor:
    """W + scaling * B @ A in float32, cast back; its own function so that W is not held past it."""
    return (base_layer.float() + scaling * (lora_B.float() @ lora_A.float())).to(base_layer.dtype)


def zero3_copy(deepspeed, parameter: torch.nn.Parameter) -> torch.Tensor:
    """A ZeRO-3 parameter whole: gathered, copied, and the gathered one released again."""
    with deepspeed.zero.GatheredParameters([parameter]):
        return parameter.detach().clone()


class WorkerWeights:
    """Methods vLLM adds to its worker (`worker_extension_cls`): load the policy's weights in place.

    vLLM's `reload_weights` redoes its own post-load processing (fused QKV, CPU repacking). A tied lm_head
    shares the embedding and loads nothing, so its own post-load step (on a CPU build, a repacked copy of
    the weight for the GEMM) is redone afterwards."""

    def load_policy_weights(self, weights) -> None:
        self.reload_weights(weights_iterator=weights, is_checkpoint_format=True)
        if self.model_config.hf_config.tie_word_embeddings:
            lm_head = self.model_runner.get_model().lm_head
            lm_head.quant_method.process_weights_after_loading(lm_head)

    def load_policy_weights_from(self, path: str) -> None:
        from safetensors import safe_open

        with safe_open(path, framework="pt") as f:
            self.load_policy_weights((name, f.get_tensor(name)) for name in f.keys())


# ---------------------------------------------------------------- engines
class ColocatedEngine(VLLMBackend):
    """generate.py's vLLM backend in this training process. On a GPU it sleeps outside generation (weights
    to host memory, KV cache freed) so that kernels can be evaluated and the policy trained; vLLM's sleep
    mode exists on GPUs only. `dtype` is the policy's: float32, or bfloat16 under --bf16 (the weights pushed
    are fp32 masters, cast on loading)."""

    def __init__(self, model_path: str, temperature: float, max_tokens: int, memory_utilization: float, seed: int,
                 dtype: str):
        self.sleeps = torch.cuda.is_available()
        world = torch.distributed.get_world_size() if torch.distributed.is_initialized() else 1
        launcher = {"distributed_executor_backend": "external_launcher"} if world > 1 else {}
        super().__init__(model_path, temperature, max_tokens, 1, memory_utilization, seed, dtype=dtype,
                         enable_sleep_mode=self.sleeps, worker_extension_cls="kevin.vllm_sync.WorkerWeights",
                         **launcher)
        self.asleep = False

    def generate(self, prompts, seeds):
        if self.asleep:
            self.llm.wake_up()
        replies = super().generate(prompts, seeds)
        if self.sleeps:
            self.llm.sleep(level=1)
        self.asleep = self.sleeps
        return replies

    def load_weights(self, weights: Iterator[tuple[str, torch.Tensor]]) -> None:
        """Into the engine, the weights woken first (not the KV cache) so the gathers have the room."""
        if self.asleep:
            self.llm.wake_up(tags=["weights"])
        self.llm.collective_rpc("load_policy_weights", args=(weights,))
        if self.asleep:
            self.llm.wake_up(tags=["kv_cache"])
            self.asleep = False
        self.llm.reset_prefix_cache()  # cached prompt blocks were computed with the old weights

    def greedy(self, prompt_ids: list[int], count: int) -> tuple[list[int], list[float]]:
        params = self.SamplingParams(temperature=0.0, max_tokens=count, logprobs=0)
        if self.asleep:
            self.llm.wake_up()
            self.asleep = False
        out = self.llm.generate([self.TokensPrompt(prompt_token_ids=prompt_ids)], params, use_tqdm=False)[0].outputs[0]
        return list(out.token_ids), [step[t].logprob for step, t in zip(out.logprobs, out.token_ids)]

    def close(self) -> None:
        """Before the process group goes: the engine's shutdown tears down its own groups."""
        self.llm.llm_engine.engine_core.shutdown()


class ServedEngine(ChatTokens):
    """A vLLM OpenAI-compatible server: /v1/completions with the prompt as token ids, answering with the reply's
    token ids and the sampling log-prob of each (the server must run with --logprobs-mode processed_logprobs).
    Top-p, top-k, min-p and penalties are sent switched off, so the model's generation_config cannot change
    the distribution the trainer's log-probs are taken from. The weights are written in `dtype`, the server's
    (--dtype): float32, or bfloat16 under --bf16."""

    TIMEOUT_S = 3600

    def __init__(self, base_url: str, tokenizer, temperature: float, max_tokens: int, dtype: str, weights_dir: Path,
                 is_main: bool, concurrency: int = 64, retries: int = 3):
        self.base_url = base_url.rstrip("/")
        self.root = self.base_url.removesuffix("/v1")
        self.tokenizer, self.temperature, self.max_tokens = tokenizer, temperature, max_tokens
        self.dtype, self.weights_path = getattr(torch, dtype), weights_dir / "model.safetensors"
        self.is_main, self.concurrency, self.retries = is_main, concurrency, retries
        self.model = served_model(self.base_url)

    def complete(self, prompt_ids: list[int], seed: int | None, temperature: float, max_tokens: int) -> Reply:
        body = {"model": self.model, "prompt": prompt_ids, "max_tokens": max_tokens, "temperature": temperature,
                "top_p": 1.0, "top_k": -1, "min_p": 0.0, "repetition_penalty": 1.0, "presence_penalty": 0.0,
                "frequency_penalty": 0.0, "logprobs": 0, "return_token_ids": True, "seed": seed}
        choice = post_json(f"{self.base_url}/completions", body, None, self.retries, self.TIMEOUT_S)["choices"][0]
        if choice.get("token_ids") is None:
            raise SystemExit(f"error: {self.base_url} returned no token ids: is it a vLLM server (return_token_ids)?")
        return Reply(choice["text"], choice["token_ids"], choice["logprobs"]["token_logprobs"])

    def generate(self, prompts: list[list[dict]], seeds: list[int]) -> list[Reply]:
        with ThreadPoolExecutor(self.concurrency) as pool:
            return list(pool.map(lambda m, s: self.complete(self.prompt_token_ids(m), s, self.temperature,
                                                            self.max_tokens), prompts, seeds))

    def load_weights(self, weights: Iterator[tuple[str, torch.Tensor]]) -> None:
        """The main process writes the weights (whole, in host memory) and has the server load them; the
        others only join the gathers."""
        if not self.is_main:
            for _ in weights:
                pass
            return
        from safetensors.torch import save_file

        self.weights_path.parent.mkdir(parents=True, exist_ok=True)
        state = {name: tensor.to("cpu", self.dtype, copy=True).contiguous() for name, tensor in weights}
        with tempfile.NamedTemporaryFile(dir=self.weights_path.parent, suffix=".tmp", delete=False) as f:
            save_file(state, f.name)
        os.replace(f.name, self.weights_path)
        post_json(f"{self.root}/collective_rpc", {"method": "load_policy_weights_from",
                                                  "args": [str(self.weights_path.resolve())]},
                  None, 0, self.TIMEOUT_S)
        post_json(f"{self.root}/reset_prefix_cache", {}, None, 0, self.TIMEOUT_S)

    def greedy(self, prompt_ids: list[int], count: int) -> tuple[list[int], list[float]]:
        reply = self.complete(prompt_ids, None, 0.0, count)
        return reply.token_ids, reply.logprobs

    def close(self) -> None:
        pass


def served_model(base_url: str) -> str:
    """The one model the server serves; a one-line error if it does not answer."""
    try:
        with urllib.request.urlopen(f"{base_url}/models", timeout=30) as response:
            return json.load(response)["data"][0]["id"]
    except (OSError, KeyError, IndexError, ValueError) as error:
        raise SystemExit(f"error: --base-url {base_url}: no vLLM server answers at {base_url}/models ({error})")


# ---------------------------------------------------------------- the check
def sync_error(engine, policy, tokenizer) -> dict:
    """After a push: does the engine's greedy reply to a fixed prompt equal the policy's, and how far apart
    are their log-probs of it (temperature 1)? The policy runs its forward pass on every rank (a collective
    when sharded)."""
    prompt = tokenizer.apply_chat_template(SYNC_PROMPT, add_generation_prompt=True, tokenize=True, return_dict=False)
    ids, engine_logprobs = engine.greedy(prompt, SYNC_TOKENS)
    device = next(policy.parameters()).device
    with torch.no_grad():
        logits = policy(input_ids=torch.tensor([prompt + ids], device=device),
                        use_cache=False).logits[0, len(prompt) - 1:-1]
    policy_logprobs = token_logprobs(logits.float(), torch.tensor(ids, device=device), 1.0)
    return {"greedy_match": logits.argmax(-1).tolist() == ids,
            "max_logprob_diff": float((policy_logprobs.cpu() - torch.tensor(engine_logprobs)).abs().max())}
