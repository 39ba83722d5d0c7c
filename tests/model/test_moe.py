"""Mixture of experts: the sorted dispatch against a naive per-token loop, every routing rule,
and the tokens-per-expert statistics through the engine."""

import dataclasses

import pytest
import torch

from radixkv.engine import Engine
from radixkv.model.config import MoEConfig
from radixkv.model.moe import MoEBlock, naive_moe, route
from tests.sched.conftest import greedy, workload

BASE = MoEConfig(num_experts=8, top_k=2, intermediate_size=24, moe_layers=(True,))
RULES = {
    "mixtral": dataclasses.replace(BASE, norm_topk_prob=True),
    "qwen3-moe-unnormalised": BASE,
    "v2-group-limited": dataclasses.replace(BASE, method="group_limited_greedy", n_group=4, topk_group=2,
                                            routed_scaling_factor=16.0, num_shared_experts=2),
    "v3-noaux-tc": dataclasses.replace(BASE, scoring="sigmoid", method="noaux_tc", n_group=4, topk_group=2,
                                       norm_topk_prob=True, routed_scaling_factor=2.5, num_shared_experts=1),
    "top-3-of-4": dataclasses.replace(BASE, num_experts=4, top_k=3),
}


def random_block(cfg: MoEConfig, hidden: int = 32) -> MoEBlock:
    torch.manual_seed(0)
    block = MoEBlock(hidden, cfg)
    with torch.no_grad():
        for p in block.parameters():
            p.normal_(0, 0.3)
    return block.eval()


@pytest.mark.parametrize("rule", sorted(RULES))
@pytest.mark.parametrize("tokens", [1, 37])
def test_sorted_dispatch_equals_the_naive_per_token_loop(rule, tokens):
    block = random_block(RULES[rule])
    x = torch.randn(tokens, 32)
    with torch.no_grad():
        assert torch.allclose(block(x, residual=None), naive_moe(block, x), atol=1e-5, rtol=1e-5)
        residual = torch.randn(tokens, 32)
        assert torch.allclose(block(x, residual=residual), residual + naive_moe(block, x), atol=1e-5, rtol=1e-5)


def test_only_the_experts_that_received_tokens_run():
    block = random_block(RULES["mixtral"])
    calls = []
    real = torch.nn.functional.linear

    def counting(x, w, *a):
        calls.append(w.shape)
        return real(x, w, *a)

    torch.nn.functional.linear = counting
    try:
        with torch.no_grad():
            block(torch.randn(1, 32), residual=None)  # one token: 2 experts of 8
    finally:
        torch.nn.functional.linear = real
    assert len(calls) == 1 + 2 * 2  # the router, then gate_up and down of each chosen expert


def test_routing_rules_pick_from_the_best_groups_only():
    cfg = RULES["v3-noaux-tc"]
    logits = torch.full((1, 8), -5.0)
    logits[0, [0, 1]] = 3.0  # group 0 is best by far; group 3's lone expert 7 is second best
    logits[0, 7] = 2.9
    bias = torch.zeros(8)
    bias[6] = 10.0  # the bias lifts group 3 (experts 6, 7) above the others, for choosing only
    weights, ids = route(logits, cfg, bias)
    assert set(ids[0].tolist()) <= {0, 1, 6, 7}
    assert 6 in ids[0].tolist()  # chosen for its bias ...
    chosen = torch.sigmoid(logits[0, ids[0]])
    assert torch.allclose(weights[0], chosen / chosen.sum() * 2.5)  # ... but weighted by its own score


def test_engine_counts_tokens_per_expert(tiny_model_dir):
    with Engine(str(tiny_model_dir("qwen3-moe")), max_total_tokens=1024, progress=False, log_level="warning") as engine:
        prompts = workload()
        engine.generate(input_ids=prompts, sampling_params=greedy())
        stats = engine.get_stats()
    per_layer = stats["expert_tokens"]
    assert sorted(per_layer) == ["0", "1"]  # both layers are sparse
    computed = stats["recomputed_prompt_tokens"] + sum(greedy()["max_new_tokens"] - 1 for _ in prompts)
    for counts in per_layer.values():
        assert len(counts) == 8 and sum(counts) == 2 * computed  # top-2 of every token the model ran
    assert stats["expert_load_imbalance"] >= 1.0
    assert sum(stats["expert_tokens_last_step"]["0"]) >= 2
