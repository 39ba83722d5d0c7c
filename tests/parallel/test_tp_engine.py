"""`Engine(tp_size=2)`: two real processes over gloo give the same greedy tokens and the same
cache decisions as one process (fp32), report their all-reduce cost, and stop cleanly; a tp_size
that cannot split the model is refused before anything starts; a lost rank is an error, not a hang.
"""

import os
import signal

import pytest

from radixkv.engine import Engine
from radixkv.errors import ConfigError, EngineError

GREEDY = {"max_new_tokens": 10, "temperature": 0}
# a small pool with a host tier below it: prefixes are evicted to the host and copied back;
# pages of 4 tokens; prompts chunked 8 tokens at a time
OPTIONS = dict(max_total_tokens=96, page_size=4, chunked_prefill_size=8, max_prefill_tokens=16,
               host_kv_size="4096", progress=False, log_level="warning")
SYSTEM = [1, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22]  # 13 tokens: ends mid-page


def workload(engine: Engine) -> tuple[list[list[int]], list[int]]:
    """Shared-prefix prompts in a batch, a multi-turn conversation, then enough other prompts to
    push the conversation out to the host tier, and its next turn (which copies it back)."""
    outputs, cached = [], []

    def ask(prompts):
        for r in engine.generate(input_ids=prompts, sampling_params=GREEDY):
            outputs.append(r["output_ids"])
            cached.append(r["meta_info"]["cached_tokens"])

    ask([SYSTEM + [100 + i, 200 + i] for i in range(4)])
    conversation = SYSTEM + [300, 301, 302]
    for turn in range(3):
        ask([conversation])
        conversation = conversation + outputs[-1] + [400 + turn, 401]
    ask([[2 + i] * 30 for i in range(4)])  # fills the pool: the conversation goes to the host
    ask([conversation])
    return outputs, cached


@pytest.fixture(scope="module")
def runs(tiny_model_dir):
    model = str(tiny_model_dir("llama-tp"))
    results = {}
    for tp in (1, 2):
        with Engine(model, tp_size=tp, **OPTIONS) as engine:
            results[tp] = (*workload(engine), engine.get_stats())
            if tp == 2:
                results["rank1"] = engine.runner.workers.procs[0]
    return results


def test_tp2_gives_the_greedy_tokens_of_one_process(runs):
    assert runs[2][0] == runs[1][0]
    # ... through every path the KV journal mirrors on rank 1: cached prefixes (request-table
    # rows written from the tree), evictions to the host tier, and a prefix copied back
    _, cached, stats = runs[2]
    assert sum(cached) > 0 and stats["evicted_tokens"] > 0
    assert stats["host_saved_tokens"] > 0 and stats["host_hit_tokens"] > 0


def test_tp2_reports_its_all_reduce_cost(runs):
    stats = runs[2][2]
    assert stats["tp_size"] == 2 and stats["tp_forwards"] > 0
    # the embedding, then attention and MLP of each of the 2 layers: 5 all-reduces per forward
    assert stats["tp_all_reduces"] == 5 * stats["tp_forwards"]
    assert stats["tp_all_gathers"] == stats["tp_forwards"]  # the logits, once per forward
    assert stats["tp_all_reduce_ms_per_forward"] > 0 and 0 < stats["tp_comm_share_of_forward"] < 1
    assert runs[1][2]["tp_size"] == 1


def test_shutdown_stops_every_rank_cleanly(runs):
    assert runs["rank1"].returncode == 0  # it left its loop on TPStop (a killed rank exits -9)


def test_a_tp_size_that_does_not_divide_the_kv_heads_is_refused_before_any_rank_starts(tiny_model_dir,
                                                                                       monkeypatch):
    from radixkv.tp.ranks import TPWorkers

    def launch(*args):
        raise AssertionError("a rank was started")

    monkeypatch.setattr(TPWorkers, "launch", launch)
    with pytest.raises(ConfigError, match=r"tp_size=2 does not divide num_key_value_heads=1"):
        Engine(str(tiny_model_dir("llama3-rope-tied")), tp_size=2, progress=False)  # MQA: 1 KV head


def test_a_lost_rank_fails_requests_with_a_clear_error_instead_of_hanging(tiny_model_dir):
    engine = Engine(str(tiny_model_dir("llama-tp")), tp_size=2, max_total_tokens=256, progress=False,
                    log_level="error")
    rank1 = engine.runner.workers.procs[0]
    assert engine.generate(input_ids=[1, 2, 3], sampling_params=GREEDY)["output_ids"]
    os.kill(rank1.pid, signal.SIGKILL)
    rank1.wait(10)
    with pytest.raises(EngineError, match=r"tensor-parallel rank 1 .*exited with code -9"):
        engine.generate(input_ids=[1, 2, 3, 4], sampling_params=GREEDY)
    with pytest.raises(EngineError, match=r"tensor-parallel rank 1"):  # and every later request
        engine.generate(input_ids=[5, 6], sampling_params=GREEDY)
    stats = engine.get_stats()  # the failed requests' pages and locks were returned
    assert stats["running_requests"] == 0 and stats["protected_tokens"] == 0
    assert stats["used_tokens"] == stats["evictable_tokens"]  # only the first request's cached KV
    engine.shutdown()


def test_an_interrupted_forward_stops_the_ranks_instead_of_leaving_them_in_a_collective(tiny_model_dir):
    engine = Engine(str(tiny_model_dir("llama-tp")), tp_size=2, max_total_tokens=256, progress=False,
                    log_level="error")
    rank1 = engine.runner.workers.procs[0]
    model = engine.runner.model

    def interrupted(fb, backend):  # Ctrl-C on rank 0 after rank 1 entered the forward
        raise KeyboardInterrupt

    engine.runner.model = interrupted
    with pytest.raises(KeyboardInterrupt):
        engine.generate(input_ids=[1, 2, 3], sampling_params=GREEDY)
    assert rank1.wait(10) == -signal.SIGKILL  # stopped, not waiting 300 s for an all-reduce
    engine.runner.model = model
    with pytest.raises(EngineError, match="KeyboardInterrupt"):  # the group is gone, and says why
        engine.generate(input_ids=[1, 2, 3], sampling_params=GREEDY)
    workers = engine.runner.workers

    def send(msg, timeout=None):
        raise AssertionError(f"shutdown sent {type(msg).__name__} to a lost group (it would wait for its timeout)")

    workers._send = send
    engine.shutdown()  # without a word to the ranks, which are gone
    assert all(p.poll() is not None for p in workers.procs)


@pytest.mark.gpu
def test_tp2_on_two_gpus_gives_the_greedy_tokens_of_one_gpu(tiny_model_dir):
    import torch

    if torch.cuda.device_count() < 2:
        pytest.skip("needs two CUDA devices")
    model = str(tiny_model_dir("llama-tp"))
    prompts = [SYSTEM + [100 + i] for i in range(4)]
    outputs = {}
    for tp in (1, 2):
        with Engine(model, tp_size=tp, dtype="float32", max_total_tokens=1024, progress=False) as engine:
            outputs[tp] = [r["output_ids"] for r in engine.generate(input_ids=prompts, sampling_params=GREEDY)]
    assert outputs[2] == outputs[1]
