"""A tiny causal language model, built locally, so every stage can run without downloading weights.

`build_tiny_model()` writes a 2-layer Qwen2-architecture model with seeded random weights and a
byte-level BPE tokenizer trained on this repository's own text (its .py and .md files) to
`.cache/tiny-model`, once, and returns that path. Both transformers and vLLM load it from there.
The model writes junk, which is its purpose: it exercises generation, evaluation and training
end to end on a CPU in seconds.

    python tiny_model.py            # build (or reuse) and print the path
"""

import os
import shutil
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent
DEFAULT_PATH = REPO / ".cache" / "tiny-model"
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
    if (path / "config.json").exists() and (path / "tokenizer.json").exists():
        return str(path)
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    tokenizer = train_tokenizer(corpus_files())
    eos, pad = tokenizer.convert_tokens_to_ids(["<|im_end|>", "<|endoftext|>"])
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,  # head_dim 64: a size every vLLM attention backend supports
        max_position_embeddings=32768,  # room for a 16k-token prompt plus a 16k-token reply
        tie_word_embeddings=True,
        bos_token_id=pad,
        eos_token_id=eos,
        pad_token_id=pad,
        torch_dtype="float32",
    )
    torch.manual_seed(SEED)
    model = Qwen2ForCausalLM(config)
    # Build in a sibling folder and rename, so a reader never sees a half-written model.
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=path.parent, prefix=path.name + ".tmp"))
    staging.chmod(0o755)
    model.save_pretrained(staging)
    tokenizer.save_pretrained(staging)
    GenerationConfig(eos_token_id=eos, pad_token_id=pad, bos_token_id=pad).save_pretrained(staging)
    try:
        staging.rename(path)
    except OSError:  # another process finished first; its model is as good as ours
        shutil.rmtree(staging)
    return str(path)


if __name__ == "__main__":
    print(build_tiny_model())
