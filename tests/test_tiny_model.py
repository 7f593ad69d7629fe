"""kevin/tiny_model.py: a seeded, locally built model and tokenizer that transformers loads, reused once built."""

from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from kevin.tiny_model import build_tiny_model, corpus_files


def test_tokenizer_is_trained_on_the_project_text_and_has_the_chat_markup():
    tokenizer = AutoTokenizer.from_pretrained(build_tiny_model())
    assert 1000 <= len(tokenizer) <= 4096
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.pad_token == "<|endoftext|>"
    text = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True,
                                         tokenize=False)
    assert text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    ids = tokenizer(text, add_special_tokens=False).input_ids
    assert ids[0] == tokenizer.convert_tokens_to_ids("<|im_start|>")
    assert any(path.name == "generate.py" for path in corpus_files())


def test_tokenizer_round_trips_code_and_compresses_it():
    tokenizer = AutoTokenizer.from_pretrained(build_tiny_model())
    code = '__global__ void k(float* x) { x[threadIdx.x] *= 2.0f; }  // ünïcode ok\n'
    ids = tokenizer(code, add_special_tokens=False).input_ids
    assert tokenizer.decode(ids) == code
    source = "import torch\nfrom torch.utils.cpp_extension import load_inline\n"
    assert len(tokenizer(source, add_special_tokens=False).input_ids) < len(source) / 2


def test_model_is_a_small_causal_lm_over_the_tokenizer_vocabulary():
    path = build_tiny_model()
    model = AutoModelForCausalLM.from_pretrained(path)
    tokenizer = AutoTokenizer.from_pretrained(path)
    assert model.config.model_type == "qwen2" and model.config.num_hidden_layers == 2
    assert model.config.eos_token_id == tokenizer.eos_token_id
    assert sum(p.numel() for p in model.parameters()) < 2_000_000
    logits = model(torch.tensor([[1, 2, 3]])).logits
    assert logits.shape == (1, 3, len(tokenizer))


def test_a_second_call_reuses_the_built_model():
    weights = Path(build_tiny_model()) / "model.safetensors"
    built_at = weights.stat().st_mtime_ns
    assert build_tiny_model() == str(weights.parent)
    assert weights.stat().st_mtime_ns == built_at


def test_builds_are_seeded_so_two_builds_are_identical(tmp_path):
    build_tiny_model(tmp_path / "a")
    build_tiny_model(tmp_path / "b")
    for name in ("model.safetensors", "tokenizer.json", "config.json"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name
