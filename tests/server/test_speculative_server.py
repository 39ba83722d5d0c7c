"""Speculative decoding through the real server: the options on `radixkv serve`, the same
greedy text as without, `meta_info.spec_verify_ct`, and the totals in /server_info and /metrics."""

import pytest

from tests.server_helpers import start_server, stop_server

QUESTION = {"text": "List the days of the week, one per line.", "sampling_params": {"max_new_tokens": 40, "temperature": 0}}


@pytest.mark.slow  # 22 s (a server of its own); speculative decoding runs in CI in tests/sched/test_speculative.py
def test_a_question_asked_again_is_drafted_from_the_radix_cache(server):
    plain = server.client().post("/generate", json=QUESTION).json()
    spec = start_server("--speculative-algorithm", "radix", "--speculative-num-draft-tokens", "6", compiled=True)
    try:
        with spec.client() as c:
            first = c.post("/generate", json=QUESTION).json()
            again = c.post("/generate", json=QUESTION).json()  # another user: the answer is cached
            metrics = c.get("/metrics").text
            stats = spec.info()["stats"]
    finally:
        assert stop_server(spec) == 0
    assert first["text"] == again["text"] == plain["text"]
    assert again["meta_info"]["spec_verify_ct"] > 0
    assert again["meta_info"]["spec_verify_ct"] < again["meta_info"]["completion_tokens"] / 2
    assert stats["spec_accepted_tokens"] > 0 and stats["spec_tokens_per_verify"] > 2
    value = next(line for line in metrics.splitlines() if line.startswith("radixkv_spec_accepted_tokens "))
    assert float(value.split()[1]) == stats["spec_accepted_tokens"]
