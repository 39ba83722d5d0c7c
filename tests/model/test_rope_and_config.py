import pytest
import torch

from radixkv.config import EngineConfig
from radixkv.errors import ConfigError, ModelLoadError
from radixkv.model.config import ModelConfig, RopeConfig
from radixkv.model.layers import rope_inv_freq
from tests.model.conftest import TINY


@pytest.mark.parametrize("name", sorted(TINY))
def test_rope_inverse_frequencies_match_transformers(name):
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    hf_cfg = TINY[name]()
    ours = ModelConfig.from_dict(hf_cfg.to_dict())
    rope_type = ours.rope.rope_type
    dim = ours.rope_dim
    if rope_type == "default":
        ref = 1.0 / ours.rope.theta ** (torch.arange(0, dim, 2).float() / dim)
    else:
        ref, _ = ROPE_INIT_FUNCTIONS[rope_type](hf_cfg, "cpu")
    assert torch.allclose(rope_inv_freq(dim, ours.rope), ref.float(), rtol=1e-5)


def test_old_style_rope_keys_and_qwen2_window_layers():
    cfg = {"architectures": ["Qwen2ForCausalLM"], "vocab_size": 10, "hidden_size": 16,
           "intermediate_size": 32, "num_hidden_layers": 4, "num_attention_heads": 4,
           "num_key_value_heads": 2, "rope_theta": 1e6, "sliding_window": 128,
           "use_sliding_window": True, "max_window_layers": 2, "eos_token_id": [5, 6]}
    mc = ModelConfig.from_dict(cfg)
    assert mc.rope == RopeConfig(theta=1e6)
    assert mc.sliding_windows == (None, None, 128, 128)
    assert mc.attention_bias and mc.eos_token_ids == (5, 6) and mc.head_dim == 4
    with pytest.raises(ModelLoadError, match="rope type 'longrope' is not supported"):
        ModelConfig.from_dict({**cfg, "rope_scaling": {"rope_type": "longrope", "factor": 4}})
    with pytest.raises(ModelLoadError, match="not a multiple"):
        ModelConfig.from_dict({**cfg, "num_key_value_heads": 3})


@pytest.mark.parametrize("field,value,message", [
    ("page_size", 0, "page_size=0: must be >= 1"),
    ("dtype", "float8", "dtype='float8'"),
    ("schedule_policy", "random", "schedule_policy='random'"),
    ("eviction_policy", "mru", "eviction_policy='mru'"),
    ("kv_mem_fraction", 1.5, "kv_mem_fraction=1.5"),
    ("max_total_tokens", 3, "max_total_tokens=3: must be at least one page"),
    ("attention_backend", "flash", "attention_backend='flash'"),
])
def test_engine_config_names_the_bad_field(field, value, message):
    kw = {field: value}
    if field == "max_total_tokens":
        kw["page_size"] = 4
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        EngineConfig.from_kwargs(**kw)


def test_engine_config_rejects_unknown_options():
    with pytest.raises(ConfigError, match=r"unknown engine option\(s\) \['pagesize'\]"):
        EngineConfig.from_kwargs(pagesize=16)


def test_auto_values_resolve_for_this_machine():
    cfg = EngineConfig()
    if not torch.cuda.is_available():
        assert (cfg.runtime.torch_device.type, cfg.runtime.torch_dtype, cfg.runtime.attention_backend_name) == ("cpu", torch.float32, "torch")
