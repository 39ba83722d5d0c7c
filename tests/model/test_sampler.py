import pytest
import torch

from radixkv.errors import InvalidRequestError
from radixkv.model.sampler import Sampler, SamplingRow, apply_penalties, filtered_probs
from radixkv.sampling_params import SamplingParams


def logits_for(*rows):
    return torch.tensor(rows, dtype=torch.float32)


def test_greedy_and_top_k_one_take_the_argmax():
    sampler = Sampler()
    logits = logits_for([0.1, 3.0, 0.2], [5.0, 1.0, 0.0])
    rows = [SamplingRow(SamplingParams(temperature=0)), SamplingRow(SamplingParams(top_k=1))]
    assert sampler.sample(logits, rows) == [1, 0]


def test_seeded_requests_sample_the_same_whatever_the_batch():
    torch.manual_seed(0)
    logits = torch.randn(4, 50)
    params = SamplingParams(temperature=1.0, seed=1234)

    def draw(batch_rows):
        sampler = Sampler(seed=99)
        gen = Sampler.request_generator(1234)
        rows = [SamplingRow(params, gen if i == 0 else None) for i in range(len(batch_rows))]
        return [sampler.sample(logits[batch_rows], rows)[0] for _ in range(20)]

    assert draw([0]) == draw([0, 1, 2, 3])


def test_top_p_keeps_the_smallest_set_reaching_p():
    probs = torch.tensor([[0.5, 0.3, 0.15, 0.05]])
    out = filtered_probs(probs.log(), [SamplingParams(top_p=0.8)])
    assert torch.allclose(out, torch.tensor([[0.5 / 0.8, 0.3 / 0.8, 0.0, 0.0]]))


def test_top_k_and_min_p_filter():
    logp = torch.tensor([[0.5, 0.3, 0.15, 0.05]]).log()
    top2 = filtered_probs(logp, [SamplingParams(top_k=2)])
    assert (top2[0, 2:] == 0).all() and top2[0, :2].sum() == pytest.approx(1.0)
    minp = filtered_probs(logp, [SamplingParams(min_p=0.4)])  # keep p >= 0.2
    assert torch.allclose(minp, torch.tensor([[0.5 / 0.8, 0.3 / 0.8, 0, 0]]))


def test_temperature_sharpens_the_distribution():
    logits = logits_for([1.0, 0.0])
    cold = filtered_probs(logits, [SamplingParams(temperature=0.25)])
    hot = filtered_probs(logits, [SamplingParams(temperature=4.0)])
    assert cold[0, 0] > 0.95 and 0.5 < hot[0, 0] < 0.6


def test_sampling_follows_the_distribution():
    sampler = Sampler(seed=0)
    logits = torch.log(torch.tensor([[0.7, 0.2, 0.1]]))
    draws = [sampler.sample(logits.clone(), [SamplingRow(SamplingParams())])[0] for _ in range(3000)]
    freq = torch.bincount(torch.tensor(draws), minlength=3).float() / len(draws)
    assert torch.allclose(freq, torch.tensor([0.7, 0.2, 0.1]), atol=0.03)


def test_penalties():
    logits = torch.tensor([2.0, -2.0, 1.0, 0.5])
    rep = apply_penalties(logits.clone(), SamplingRow(SamplingParams(repetition_penalty=2.0),
                                                      output_ids=[0], prompt_ids=[1]))
    assert rep.tolist() == [1.0, -4.0, 1.0, 0.5]
    freq = apply_penalties(logits.clone(), SamplingRow(SamplingParams(frequency_penalty=0.5,
                                                                      presence_penalty=0.25),
                                                       output_ids=[2, 2, 3]))
    assert freq.tolist() == [2.0, -2.0, 1.0 - 1.0 - 0.25, 0.5 - 0.5 - 0.25]


def test_suppressed_ids_are_never_chosen():
    sampler = Sampler()
    out = sampler.sample(logits_for([9.0, 1.0]), [SamplingRow(SamplingParams(temperature=0), suppress_ids=(0,))])
    assert out == [1]


@pytest.mark.parametrize("params,field", [
    ({"temperature": -1}, "temperature"), ({"top_p": 0}, "top_p"), ({"top_p": 1.5}, "top_p"),
    ({"max_new_tokens": -1}, "max_new_tokens"), ({"max_new_tokens": 10**9}, "max_new_tokens"),
    ({"min_new_tokens": 5, "max_new_tokens": 2}, "min_new_tokens"), ({"top_k": 2.5}, "top_k"),
    ({"min_p": 2}, "min_p"), ({"seed": "x"}, "seed"), ({"stop": [""]}, "stop"),
    ({"stop_token_ids": [-3]}, "stop_token_ids"), ({"temperature": float("nan")}, "temperature"),
    ({"repetition_penalty": 0}, "repetition_penalty"), ({"max_tokens": 3}, "unknown"),
])
def test_bad_sampling_params_name_the_field(params, field):
    with pytest.raises(InvalidRequestError, match=field):
        SamplingParams.from_dict(params)


def test_stop_string_is_accepted_alone():
    assert SamplingParams.from_dict({"stop": "###"}).stop == ("###",)


def test_penalties_and_suppression_work_on_inference_mode_logits():
    # the model's forward returns inference tensors; editing them in place outside
    # inference mode raised "Inplace update to inference tensor"
    with torch.inference_mode():
        logits = logits_for([9.0, 1.0, 0.5])
    rows = [SamplingRow(SamplingParams(temperature=0, repetition_penalty=1.5), output_ids=[1],
                        suppress_ids=(0,))]
    assert Sampler().sample(logits, rows) == [1]
