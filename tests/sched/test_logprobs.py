"""Log-probabilities of output and prompt tokens against transformers' own logits."""

import pytest
import torch
from transformers import AutoModelForCausalLM

from radixkv.errors import InvalidRequestError
from tests.sched.conftest import assert_idle_and_clean, greedy

PROMPT = [1, 17, 230, 5, 88, 402, 9, 61, 300, 12, 7, 44, 3, 250, 251, 252]


@pytest.fixture(scope="module")
def hf(tiny_model_dir):
    return AutoModelForCausalLM.from_pretrained(tiny_model_dir("llama"), dtype=torch.float32).eval()


def hf_logprobs(hf, ids):
    """log-softmax of transformers' logits at every position: (L, V)."""
    with torch.no_grad():
        return torch.log_softmax(hf(torch.tensor([ids])).logits[0].float(), -1)


def test_output_logprobs_and_top_alternatives_match_transformers(tiny_engine, hf):
    engine = tiny_engine()
    out = engine.generate(input_ids=PROMPT, sampling_params=greedy(6), return_logprob=True, top_logprobs_num=3)
    ids = out["output_ids"]
    ref = hf_logprobs(hf, PROMPT + ids)
    got = out["meta_info"]["output_token_logprobs"]
    assert [t for _, t in got] == ids
    for k, (lp, tok) in enumerate(got):
        row = ref[len(PROMPT) - 1 + k]
        assert lp == pytest.approx(float(row[tok]), abs=1e-4)
        top = out["meta_info"]["output_top_logprobs"][k]
        assert [t for _, t in top] == row.topk(3).indices.tolist()
        assert top[0][1] == tok  # greedy: the most likely token is the one chosen


@pytest.mark.parametrize("options", [{}, {"chunked_prefill_size": 4}], ids=["one-chunk", "chunked"])
def test_prompt_logprobs_from_a_start_position_match_transformers(tiny_engine, hf, options):
    engine = tiny_engine(**options)
    start = 5
    out = engine.generate(input_ids=PROMPT, sampling_params=greedy(2), return_logprob=True,
                          logprob_start_len=start)
    got = out["meta_info"]["input_token_logprobs"]
    ref = hf_logprobs(hf, PROMPT)
    assert [t for _, t in got] == PROMPT[start:]
    for p, (lp, tok) in zip(range(start, len(PROMPT)), got):
        assert lp == pytest.approx(float(ref[p - 1, tok]), abs=1e-4)
    from_zero = engine.generate(input_ids=PROMPT, sampling_params=greedy(1), return_logprob=True,
                                logprob_start_len=0)["meta_info"]["input_token_logprobs"]
    assert from_zero[0] == [None, PROMPT[0]] and len(from_zero) == len(PROMPT)
    assert_idle_and_clean(engine)


def test_a_cached_prefix_is_reused_only_up_to_the_logprob_start(tiny_engine, hf):
    engine = tiny_engine()
    engine.generate(input_ids=PROMPT, sampling_params=greedy(1))  # caches all but the last token
    late = engine.generate(input_ids=PROMPT, sampling_params=greedy(1), return_logprob=True,
                           logprob_start_len=12)
    assert late["meta_info"]["cached_tokens"] == 11  # reuses everything before position 11
    ref = hf_logprobs(hf, PROMPT)
    for p, (lp, tok) in zip(range(12, len(PROMPT)), late["meta_info"]["input_token_logprobs"]):
        assert lp == pytest.approx(float(ref[p - 1, tok]), abs=1e-4)
    plain = engine.generate(input_ids=PROMPT, sampling_params=greedy(1))
    assert plain["meta_info"]["cached_tokens"] == len(PROMPT) - 1


def test_prefill_only_request_returns_prompt_logprobs(tiny_engine):
    engine = tiny_engine()
    out = engine.generate(input_ids=PROMPT, sampling_params=greedy(0), return_logprob=True, logprob_start_len=10)
    assert out["output_ids"] == [] and len(out["meta_info"]["input_token_logprobs"]) == len(PROMPT) - 10


@pytest.mark.parametrize("kwargs,match", [
    ({"return_logprob": True, "top_logprobs_num": 50}, "top_logprobs_num=50"),
    ({"return_logprob": True, "logprob_start_len": 99}, "logprob_start_len=99"),
    ({"logprob_start_len": 3}, "need return_logprob"),
    ({"return_logprob": "yes"}, "return_logprob"),
])
def test_bad_logprob_arguments_are_typed_errors(tiny_engine, kwargs, match):
    engine = tiny_engine()
    with pytest.raises(InvalidRequestError, match=match):
        engine.generate(input_ids=PROMPT, sampling_params=greedy(2), **kwargs)
