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
    engine = Engine(str(path), max_total_tokens=2048, progress=False, log_level="warning", **options)
    try:
        first = [o["output_ids"] for o in engine.generate(input_ids=prompts, sampling_params=greedy())]
        again = [o["output_ids"] for o in engine.generate(input_ids=prompts, sampling_params=greedy())]
        stats = engine.get_stats()
    finally:
        engine.shutdown()
    assert first == want and again == want
    if not options.get("disable_radix_cache"):
        assert stats["cached_prompt_tokens"] > 0
