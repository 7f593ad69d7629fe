"""The generation backends: Hugging Face transformers, vLLM, and any OpenAI-compatible server.

A backend has three methods: prompt_token_ids(messages) -> ids or None, count_tokens(messages) -> int, and
generate(prompts, seeds) -> one Reply per prompt, in order. generate.py picks one; train.py generates with the
policy it trains through the first two (and vllm_sync.py's engines, which are vLLM's).
"""
import importlib.util
import json
import os
import re
import sys
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from tqdm import tqdm


@dataclass
class Reply:
    text: str
    token_ids: list[int] | None
    # hf and vllm: log-prob of each sampled token under the sampling distribution (temperature applied);
    # openai: what the server reports, if anything
    logprobs: list[float] | None


class ChatTokens:
    """Prompt token ids through the model's own chat template, the assistant turn opened; for the
    backends that hold a tokenizer (`self.tokenizer`)."""

    def prompt_token_ids(self, messages: list[dict]) -> list[int]:
        text = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        return self.tokenizer(text, add_special_tokens=False).input_ids

    def count_tokens(self, messages: list[dict]) -> int:
        return len(self.prompt_token_ids(messages))


class HFBackend(ChatTokens):
    """transformers `generate`, batched with left padding; log-probs from the per-step scores.

    `model` is a path or hub id to load, or a model already in memory (train.py's policy), which then
    comes with its `tokenizer` (padding on the left). `synced_gpus` keeps every rank stepping until all
    are done, which sharded models (FSDP, ZeRO-3) need because each forward pass gathers parameters."""

    def __init__(self, model, temperature: float, max_tokens: int, tokenizer=None, synced_gpus: bool = False,
                 progress: bool = False):
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        if isinstance(model, (str, os.PathLike)):
            tokenizer = AutoTokenizer.from_pretrained(model, padding_side="left")
            device = "cuda" if torch.cuda.is_available() else "cpu"
            model = AutoModelForCausalLM.from_pretrained(model, dtype="auto").to(device).eval()
        elif tokenizer is None:
            raise ValueError("HFBackend: a model object needs its tokenizer")
        self.model, self.tokenizer = model, tokenizer
        self.temperature, self.max_tokens, self.synced_gpus = temperature, max_tokens, synced_gpus
        self.progress = progress
        eos = self.model.generation_config.eos_token_id
        self.eos_ids = set(eos if isinstance(eos, list) else [eos if eos is not None else self.tokenizer.eos_token_id])
        self.pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else min(self.eos_ids)

    def generate(self, prompts: list[list[dict]], seeds: list[int]) -> list[Reply]:
        """Each reply draws its tokens with its own seed (RowSampler), so it does not depend on the other prompts of
        its batch; only the last bits of its log-probs do (the batch's size and padding change the sums). The
        checkpoint's generation_config is set aside meanwhile: the processors it would add (a repetition penalty,
        no-repeat n-grams, suppressed tokens; `generate` fills a config's defaults from it) would make the sampler
        draw from a distribution the trainer never computes."""
        import torch
        from transformers import GenerationConfig

        batch = self.tokenizer.pad({"input_ids": [self.prompt_token_ids(m) for m in prompts]}, return_tensors="pt")
        batch = batch.to(self.model.device)
        sampler = RowSampler(seeds, self.temperature)
        shipped, self.model.generation_config = self.model.generation_config, GenerationConfig()
        try:
            with torch.no_grad(), token_progress(self.max_tokens, len(prompts), self.progress) as step:
                # greedy search over what the sampler leaves: the one token it drew in each row
                sequences = self.model.generate(
                    **batch, do_sample=False, logits_processor=[sampler], max_new_tokens=self.max_tokens,
                    pad_token_id=self.pad_id, eos_token_id=sorted(self.eos_ids), synced_gpus=self.synced_gpus,
                    stopping_criteria=[step],
                )
        finally:
            self.model.generation_config = shipped
        new_tokens = sequences[:, batch["input_ids"].shape[1]:].tolist()
        replies = []
        for ids, lps in zip(new_tokens, sampler.logprobs()):
            end = next((i + 1 for i, t in enumerate(ids) if t in self.eos_ids), len(ids))  # keep the eos
            text = self.tokenizer.decode(ids[:end], skip_special_tokens=True)
            replies.append(Reply(text, ids[:end], lps[:end]))
        return replies


class RowSampler:
    """A logits processor that samples every row of a batch from softmax(scores / temperature) with the row's own
    generator (on the host, seeded with its reply's seed), and leaves only the drawn token for the search to take.
    So a reply's tokens depend on its prompt and seed, not on what else is in its batch, which lets a rollout batch
    its prompts however it likes. Each drawn token's log-probability is kept."""

    def __init__(self, seeds: list[int], temperature: float):
        import torch

        self.generators = [torch.Generator().manual_seed(seed) for seed in seeds]
        self.temperature = temperature
        self.steps = []  # per step, the drawn tokens' log-probs, one per row

    def __call__(self, input_ids, scores):
        import torch

        logprobs = torch.log_softmax(scores.float() / self.temperature, dim=-1)
        cumulative = logprobs.exp().cumsum(-1)
        draws = torch.cat([torch.rand(1, generator=g) for g in self.generators]).to(scores.device)
        # inverse transform sampling: the first token whose cumulative probability passes the draw
        tokens = torch.searchsorted(cumulative, (draws * cumulative[:, -1])[:, None], right=True)
        tokens = tokens.clamp(max=scores.shape[-1] - 1)
        self.steps.append(logprobs.gather(1, tokens))
        return torch.full_like(scores, -float("inf")).scatter_(1, tokens, 0.0)

    def logprobs(self) -> list[list[float]]:
        """Per row, the log-prob of each token drawn (padding after a row's end included)."""
        import torch

        return torch.cat(self.steps, dim=1).tolist() if self.steps else [[] for _ in self.generators]


@contextmanager
def token_progress(max_tokens: int, replies: int, show: bool):
    """A bar over the tokens of one generation batch, advanced by a stopping criterion that never stops."""
    import torch

    with tqdm(total=max_tokens, desc=f"generate (batch of {replies})", unit="token", leave=False,
              disable=not show, file=sys.stderr) as bar:
        def step(input_ids, scores, **kwargs):
            bar.update(1)
            return torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)
        yield step


class VLLMBackend(ChatTokens):
    """Offline `vllm.LLM`; prompts go in as token ids so the recorded ids are exactly what the model saw. Its
    SamplingParams are made here, temperature alone: the checkpoint's generation_config reaches them only through
    `LLM.get_default_sampling_params`, which nothing here calls, so replies are sampled from exactly the
    distribution the trainer scores."""

    def __init__(self, model: str, temperature: float, max_tokens: int, tensor_parallel_size: int,
                 memory_utilization: float, seed: int, progress: bool = False, **engine_args):
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # keep the engine in this process
        from vllm import LLM, SamplingParams
        from vllm.inputs import TokensPrompt

        self.SamplingParams, self.TokensPrompt = SamplingParams, TokensPrompt
        # processed_logprobs: log-probs after temperature, i.e. of the distribution actually sampled
        self.llm = LLM(model=model, tensor_parallel_size=tensor_parallel_size, seed=seed,
                       gpu_memory_utilization=memory_utilization, logprobs_mode="processed_logprobs",
                       **engine_args)
        self.tokenizer = self.llm.get_tokenizer()
        self.temperature, self.max_tokens, self.progress = temperature, max_tokens, progress

    def generate(self, prompts: list[list[dict]], seeds: list[int]) -> list[Reply]:
        inputs = [self.TokensPrompt(prompt_token_ids=self.prompt_token_ids(m)) for m in prompts]
        params = [self.SamplingParams(temperature=self.temperature, max_tokens=self.max_tokens, seed=seed,
                                      logprobs=0) for seed in seeds]
        replies = []
        for result in self.llm.generate(inputs, params, use_tqdm=self.progress):
            out = result.outputs[0]
            ids = list(out.token_ids)
            logprobs = [step[t].logprob for step, t in zip(out.logprobs, ids)]
            replies.append(Reply(out.text, ids, logprobs))
        return replies


RETRY_WAIT_S = 8  # the longest wait before a retry: --retries 5 waits 1 + 2 + 4 + 8 + 8 s at most


def post_json(url: str, body: dict, api_key: str | None, retries: int, timeout_s: float) -> dict:
    """POST a JSON body and read the JSON answer. Only what can pass is retried, with a short back-off: a timeout, a
    dropped connection, a rate limit (429) or a server error (5xx). Anything else (a refused connection: nothing
    listens there; any other 4xx), or the last failure, is a one-line error naming the URL."""
    headers = {"Content-Type": "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    for attempt in range(retries + 1):
        request = urllib.request.Request(url, data=json.dumps(body).encode(), headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=timeout_s) as response:
                return json.load(response)
        except urllib.error.HTTPError as error:
            if error.code < 500 and error.code != 429 or attempt == retries:
                raise SystemExit(f"error: {url} answered {error.code}: {error.read()[:500]!r}") from None
        except OSError as error:  # urllib.error.URLError wraps what the connection raised in `reason`
            reason = getattr(error, "reason", error)
            if not isinstance(reason, (TimeoutError, ConnectionResetError)):
                raise SystemExit(f"error: cannot reach {url}: {reason} (is the server up? --base-url)") from None
            if attempt == retries:
                raise SystemExit(f"error: {url} failed after {retries} retries: {reason}") from None
        time.sleep(min(2 ** attempt, RETRY_WAIT_S))


class OpenAIBackend:
    """Any OpenAI-compatible /chat/completions endpoint, over the standard library, many requests at once.

    Requests ask for plain sampling at the temperature with the API's own fields (top_p 1, no presence or frequency
    penalty), so that a server's defaults for them do not apply. What the API has no field for cannot be asked: a
    vLLM server started with `--generation-config auto` (its default) applies the checkpoint's top-k, min-p and
    repetition penalty to requests that do not name them; start it with `--generation-config vllm` for the
    distribution the other backends sample. (train.py's vllm-server backend, which knows its server is vLLM, sends
    those fields switched off: kevin/vllm_sync.py.)"""

    TIMEOUT_S = 3600  # one long reasoning reply can take many minutes

    def __init__(self, model: str, temperature: float, max_tokens: int, base_url: str, api_key: str | None,
                 concurrency: int, retries: int, progress: bool = False):
        self.model, self.temperature, self.max_tokens, self.progress = model, temperature, max_tokens, progress
        self.url = base_url.rstrip("/") + "/chat/completions"
        self.api_key, self.concurrency, self.retries = api_key, concurrency, retries

    def prompt_token_ids(self, messages: list[dict]) -> None:
        return None  # the server tokenizes

    def count_tokens(self, messages: list[dict]) -> int:
        return sum(len(m["content"]) for m in messages) // 4  # an estimate: ~4 characters per token

    def complete(self, messages: list[dict], seed: int) -> Reply:
        body = {"model": self.model, "messages": messages, "temperature": self.temperature, "top_p": 1.0,
                "presence_penalty": 0.0, "frequency_penalty": 0.0, "max_tokens": self.max_tokens, "seed": seed,
                "logprobs": True}
        choice = post_json(self.url, body, self.api_key, self.retries, self.TIMEOUT_S)["choices"][0]
        message = choice["message"]
        text = message.get("content") or ""
        reasoning = message.get("reasoning_content") or message.get("reasoning")
        if reasoning:  # servers that split the reasoning off: put it back where the parser expects it
            text = f"<think>{reasoning}</think>{text}"
        steps = (choice.get("logprobs") or {}).get("content")
        return Reply(text, None, [s["logprob"] for s in steps] if steps else None)

    def generate(self, prompts: list[list[dict]], seeds: list[int]) -> list[Reply]:
        with ThreadPoolExecutor(self.concurrency) as pool:
            return list(tqdm(pool.map(self.complete, prompts, seeds), total=len(prompts), desc="generate",
                             unit="reply", leave=False, disable=not self.progress, file=sys.stderr))


HUB_ID = re.compile(r"[\w.-]+(/[\w.-]+)?")


def check_model(model: str) -> None:
    """Stop with one line unless `model` is a local folder, or a hub id that is cached or that the hub knows:
    transformers would otherwise retry for a minute and end in a traceback."""
    if Path(model).expanduser().exists():
        return
    if not HUB_ID.fullmatch(model):
        raise SystemExit(f"error: --model {model}: no such folder (nor a Hugging Face id like org/name)")
    from huggingface_hub import model_info, try_to_load_from_cache

    if isinstance(try_to_load_from_cache(model, "config.json"), str):
        return
    try:
        model_info(model, timeout=10)
    except Exception as error:  # offline, unknown id, gated: whatever the hub says, the model cannot be loaded
        raise SystemExit(f"error: --model {model}: not a local folder, not in the Hugging Face cache, and the hub "
                         f"does not serve it ({type(error).__name__}: {str(error).splitlines()[0][:200]})") from None


def check_vllm() -> None:
    """--backend vllm needs vLLM, which requirements.txt leaves out (docs/generation.md: its own environment)."""
    if importlib.util.find_spec("vllm") is None:
        raise SystemExit("error: --backend vllm: vLLM is not installed in this Python (see docs/generation.md, Installing vLLM); "
                         "use --backend hf or the vLLM environment's python")
