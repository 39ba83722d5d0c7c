"""Tiny random-initialised Llama / Qwen2 / Qwen3 / Mistral checkpoints, built offline in about a second."""

import torch
from transformers import AutoModelForCausalLM, LlamaConfig, MistralConfig, Qwen2Config, Qwen3Config

COMMON = dict(vocab_size=512, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
              num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=512,
              bos_token_id=1, eos_token_id=None, pad_token_id=0)
TINY = {
    "llama": lambda: LlamaConfig(**COMMON, tie_word_embeddings=False),
    "llama3-rope-tied": lambda: LlamaConfig(
        **{**COMMON, "num_key_value_heads": 1}, tie_word_embeddings=True,  # MQA
        rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                         "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                         "original_max_position_embeddings": 64}),
    "qwen2": lambda: Qwen2Config(**COMMON, tie_word_embeddings=False),
    # per-head q/k RMSNorm, no q/k/v bias, a head_dim of its own (not hidden / heads)
    "qwen3": lambda: Qwen3Config(**COMMON, head_dim=32, tie_word_embeddings=True),
    # tensor-parallel tests: 4 KV heads split over 2 ranks; an odd vocabulary pads the last rank
    "llama-tp": lambda: LlamaConfig(**{**COMMON, "num_key_value_heads": 4, "vocab_size": 509},
                                    tie_word_embeddings=False),
    "qwen2-tp-tied": lambda: Qwen2Config(**{**COMMON, "num_key_value_heads": 4, "vocab_size": 509},
                                         tie_word_embeddings=True),
    # positions for the 4,096-token prompts of the compiled forward's shape sweep
    "llama-long": lambda: LlamaConfig(**{**COMMON, "max_position_embeddings": 8192}, tie_word_embeddings=False),
    "mistral-window": lambda: MistralConfig(**{**COMMON, "num_key_value_heads": 4}, sliding_window=6,
                                            tie_word_embeddings=False),
}


def save_tiny_model(name: str, path) -> None:
    torch.manual_seed(sum(map(ord, name)))
    model = AutoModelForCausalLM.from_config(TINY[name]())
    # random init leaves small weights: scale up so greedy tokens are not all alike
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.mul_(3.0)
    model.save_pretrained(path)


def save_tiny_chat_model(path) -> None:
    """`llama-tp` with the default model's vocabulary and tokenizer (4 KV heads, 2 layers): a
    model the server can load in a second and talk to in text. Needs the default model."""
    import json
    import shutil

    from radixkv.model.gguf import default_model_dir

    source = default_model_dir()
    vocab = json.loads((source / "config.json").read_text())["vocab_size"]
    torch.manual_seed(7)
    config = LlamaConfig(**{**COMMON, "num_key_value_heads": 4, "vocab_size": vocab, "eos_token_id": 2},
                         tie_word_embeddings=True)
    AutoModelForCausalLM.from_config(config).save_pretrained(path)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        if (source / name).is_file():
            shutil.copy(source / name, path)
