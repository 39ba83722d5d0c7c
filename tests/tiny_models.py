"""Tiny random-initialised Llama / Qwen2 / Mistral checkpoints, built offline in about a second."""

import torch
from transformers import AutoModelForCausalLM, LlamaConfig, MistralConfig, Qwen2Config

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
