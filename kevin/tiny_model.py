"""A tiny causal language model, built locally, so every stage can run without downloading weights.

`build_tiny_model()` writes a 2-layer Qwen2-architecture model with seeded random weights and a
byte-level BPE tokenizer trained on this repository's own text (its .py and .md files) to
`.cache/tiny-model`, once, and returns that path. Both transformers and vLLM load it from there.
The model writes junk, which is its purpose: it exercises generation, evaluation and training
end to end on a CPU in seconds.

`build_qwen2_05b_shaped()` writes, to `.cache/qwen2-0.5b-shaped`, seeded random bf16 weights in the
shape of Qwen2-0.5B (494M parameters: 24 layers, hidden 896, 14 query and 2 key-value heads, MLP 4864,
a 151936-row embedding tied to the output layer) with the tiny tokenizer, so multi-GPU training can be
timed and checked at a real model's size without downloading one. The tokenizer produces only its 3000
ids; the model's other rows are still trained (through the tied output layer) and may be sampled, and
decoding skips them.

    python tiny_model.py                    # build (or reuse) the tiny model and print the path
    python tiny_model.py --qwen2-0.5b-shaped   # the same for the Qwen2-0.5B-shaped model
"""

import os
import shutil
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEFAULT_PATH = REPO / ".cache" / "tiny-model"
QWEN2_05B_PATH = REPO / ".cache" / "qwen2-0.5b-shaped"
# Qwen2-0.5B's config.json, less what the tokenizer decides (special token ids) and the context length.
QWEN2_05B_SHAPE = {"vocab_size": 151936, "hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 24,
                   "num_attention_heads": 14, "num_key_value_heads": 2, "rope_theta": 1e6, "rms_norm_eps": 1e-6}
VOCAB_SIZE = 3000
SEED = 0
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# Qwen-style chat markup; the generation prompt opens the assistant turn.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def corpus_files(repo: Path = REPO) -> list[Path]:
    """The project's own text: tasks, top-level scripts and the README (sorted, so builds repeat)."""
    files = sorted(repo.glob("tasks/**/*.py")) + sorted(repo.glob("*.py")) + sorted(repo.glob("*.md"))
    return [f for f in files if f.is_file()]


def train_tokenizer(files: list[Path], vocab_size: int = VOCAB_SIZE):
    """Byte-level BPE, so any text (code, CUDA, prose) round-trips without unknown tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator((f.read_text(errors="replace") for f in files), trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        chat_template=CHAT_TEMPLATE,
        model_max_length=32768,
    )


def build_tiny_model(path: str | os.PathLike = DEFAULT_PATH) -> str:
    """Build the tiny model at `path` unless it is already there; return the path as a string."""
    path = Path(path)
    if not is_built(path):
        tokenizer = train_tokenizer(corpus_files())
        # head_dim 64: a size every vLLM attention backend supports
        shape = {"vocab_size": len(tokenizer), "hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 2,
                 "num_attention_heads": 2, "num_key_value_heads": 2}
        write_model(path, tokenizer, shape, "float32")
    return str(path)


def build_qwen2_05b_shaped(path: str | os.PathLike = QWEN2_05B_PATH) -> str:
    """Build the Qwen2-0.5B-shaped random model at `path` unless it is already there; return the path."""
    path = Path(path)
    if not is_built(path):
        from transformers import AutoTokenizer

        write_model(path, AutoTokenizer.from_pretrained(build_tiny_model()), QWEN2_05B_SHAPE, "bfloat16")
    return str(path)


def is_built(path: Path) -> bool:
    return (path / "config.json").exists() and (path / "tokenizer.json").exists()


def random_qwen2(tokenizer, shape: dict, seed: int = SEED, dtype: str = "float32"):
    """A Qwen2 model of this shape with seeded random weights, its special tokens and generation config
    those of `tokenizer`."""
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    eos, pad = tokenizer.convert_tokens_to_ids(["<|im_end|>", "<|endoftext|>"])
    config = Qwen2Config(
        **{"tie_word_embeddings": True, **shape},  # tied like Qwen2-0.5B unless the shape says otherwise
        max_position_embeddings=32768,  # room for a 16k-token prompt plus a 16k-token reply
        bos_token_id=pad,
        eos_token_id=eos,
        pad_token_id=pad,
        torch_dtype=dtype,
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config).to(getattr(torch, dtype))
    model.generation_config = GenerationConfig(eos_token_id=eos, pad_token_id=pad, bos_token_id=pad)
    return model


def write_model(path: Path, tokenizer, shape: dict, dtype: str) -> None:
    """A Qwen2 model of this shape with seeded random weights, saved with `tokenizer` at `path`."""
    model = random_qwen2(tokenizer, shape, dtype=dtype)
    # Build in a sibling folder and rename, so a reader never sees a half-written model.
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=path.parent, prefix=path.name + ".tmp"))
    staging.chmod(0o755)
    model.save_pretrained(staging)
    tokenizer.save_pretrained(staging)
    try:
        staging.rename(path)
    except OSError:  # another process finished first; its model is as good as ours
        shutil.rmtree(staging)


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--qwen2-0.5b-shaped", dest="qwen2", action="store_true",
                        help="build the random model of Qwen2-0.5B's shape instead of the tiny one")
    print(build_qwen2_05b_shaped() if parser.parse_args().qwen2 else build_tiny_model())
