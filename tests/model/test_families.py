"""Each supported architecture through the whole engine: greedy tokens equal transformers'
with the prefix cache on and off, prompts chunked, in mixed batches over a cached prefix."""

import pytest
import torch
from transformers import AutoModelForCausalLM

from radixkv.engine import Engine
from radixkv.model.config import SUPPORTED_ARCHITECTURES
from tests.model.conftest import hf_greedy
from tests.sched.conftest import greedy, workload

FAMILIES = ["llama", "qwen2", "qwen3", "mistral-window", "gemma3", "deepseek-v2", "deepseek-v3",
            "qwen3-moe", "mixtral"]  # one tiny checkpoint per architecture


def test_every_supported_architecture_has_a_tiny_checkpoint_here():
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    from tests.tiny_models import TINY

    archs = {MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[TINY[name]().model_type] for name in FAMILIES}
    assert archs == set(SUPPORTED_ARCHITECTURES)


@pytest.mark.parametrize("options", [dict(), dict(disable_radix_cache=True),
                                     dict(chunked_prefill_size=8, max_prefill_tokens=16)],
                         ids=["cache", "no-cache", "chunked"])
@pytest.mark.parametrize("name", FAMILIES)
def test_engine_greedy_equals_transformers(tiny_model_dir, name, options):
    path = tiny_model_dir(name)
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    prompts = workload()  # shared "system prompt" prefixes: later requests hit, and ride in mixed batches
    want = [hf_greedy(hf, p, 12) for p in prompts]
    # eager: the compiled forward of every architecture is checked in test_tiny_models
    engine = Engine(str(path), max_total_tokens=2048, progress=False, log_level="warning", compile="off", **options)
    try:
        first = [o["output_ids"] for o in engine.generate(input_ids=prompts, sampling_params=greedy())]
        again = [o["output_ids"] for o in engine.generate(input_ids=prompts, sampling_params=greedy())]
        stats = engine.get_stats()
    finally:
        engine.shutdown()
    assert first == want and again == want
    if not options.get("disable_radix_cache"):
        assert stats["cached_prompt_tokens"] > 0


@pytest.mark.parametrize("name, what", [("deepseek-v2", "multi-head latent attention"),
                                        ("qwen3-moe", "mixture-of-experts")])
def test_tensor_parallel_refuses_what_it_cannot_split_yet(tiny_model_dir, name, what):
    from radixkv.errors import ConfigError
    from radixkv.model.config import ModelConfig, check_tp_size

    config = ModelConfig.from_file(tiny_model_dir(name) / "config.json")
    with pytest.raises(ConfigError, match=f"does not support {what}.*tp_size=1"):
        check_tp_size(config, 2)


def test_an_unknown_architecture_is_refused_with_the_supported_list():
    from radixkv.errors import ModelLoadError
    from radixkv.model.config import ModelConfig

    with pytest.raises(ModelLoadError, match="unsupported architecture 'FalconForCausalLM'.*Gemma3ForCausalLM.*"
                                             "DeepseekV3ForCausalLM.*MixtralForCausalLM"):
        ModelConfig.from_dict({"architectures": ["FalconForCausalLM"], "vocab_size": 8, "hidden_size": 8,
                               "intermediate_size": 8, "num_hidden_layers": 1, "num_attention_heads": 1})
