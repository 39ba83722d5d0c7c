"""`radixkv serve --kv-events-config`: a subscriber follows the real server's KV cache through
shared prefixes, evictions to the host tier and a flush, and rebuilds the pages the server
holds; a late subscriber rebuilds the same tree from the replay socket; the sockets close with
the server."""

import json

import pytest
import zmq

from tests.kv_events_helpers import Subscriber, free_port
from tests.server_helpers import start_server, stop_server
from tests.tiny_models import tiny_chat_model_dir

PAGE = 4
SYSTEM = list(range(10, 50))  # a 40-token shared prefix


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """(server, its kv-events config): a tiny chat model, a 128-token pool, a 64-token host tier."""
    path = tiny_chat_model_dir(tmp_path_factory)
    config = {"publisher": "zmq", "endpoint": f"tcp://*:{free_port()}", "topic": "kv-events",
              "replay_endpoint": f"tcp://*:{free_port()}", "buffer_steps": 4, "hwm": 100000}
    server = start_server("--model", str(path), "--page-size", str(PAGE), "--max-total-tokens", "128",
                          "--host-kv-size", "64", "--kv-events-config", json.dumps(config), api_key=None)
    yield server, config
    if server.proc.poll() is None:
        server.proc.kill()


def generate(server, prompts, n=4):
    with server.client() as c:
        r = c.post("/generate", json={"input_ids": prompts, "sampling_params": {"max_new_tokens": n,
                                                                                 "temperature": 0}})
        assert r.status_code == 200, r.text


def held_on(subscriber, medium):
    return sum(medium in mediums for _, _, mediums in subscriber.ledger.held().values())


def follow(server, subscriber):
    """Wait for the server to be idle and the subscriber to have every batch; /server_info."""
    info = server.wait_idle()
    subscriber.catch_up(info["kv_events"]["published_batches"])
    return info


def test_a_subscriber_rebuilds_the_pages_the_server_holds(served):
    server, config = served
    block = server.info()["kv_events"]
    assert block["topic"] == "kv-events" and block["page_size"] == block["block_size"] == PAGE
    assert block["endpoint"].endswith(config["endpoint"].rsplit(":", 1)[1])
    assert block["replay_endpoint"].endswith(config["replay_endpoint"].rsplit(":", 1)[1])
    sub = Subscriber(block["endpoint"], block["replay_endpoint"], "kv-events", PAGE)
    late = None
    try:
        generate(server, [SYSTEM + [100, 101, 102, 103], SYSTEM + [200, 201, 202, 203]])
        info = follow(server, sub)
        assert held_on(sub, "GPU") * PAGE == info["kv_pool"]["cached_tokens_in_tree"] > len(SYSTEM)
        roots = [h for h, (parent, _, _) in sub.ledger.held().items() if parent is None]
        assert len(roots) == 1  # the shared prefix is one chain, the tails branch off it
        for start in (300, 400, 500, 600, 700):  # prompts that push earlier pages to the host tier, then out of it
            generate(server, [list(range(start, start + 44))])
        info = follow(server, sub)
        stats = info["stats"]
        assert stats["evicted_tokens"] > 0 and stats["host_evicted_tokens"] > 0
        assert held_on(sub, "GPU") * PAGE == info["kv_pool"]["cached_tokens_in_tree"]
        assert held_on(sub, "CPU") * PAGE == stats["host_used_tokens"] > 0
        assert info["kv_events"]["published_batches"] == sub.last_seq + 1 > config["buffer_steps"]
        late = Subscriber(block["endpoint"], block["replay_endpoint"], "kv-events", PAGE)
        late.catch_up(info["kv_events"]["published_batches"])  # from 0, older than the buffer: the tree
        assert len(late.replays[0]) == 1 and late.ledger.held() == sub.ledger.held()
        with server.client() as c:
            assert c.post("/flush_cache").json() == {"flushed": True}
        follow(server, sub)
        assert sub.ledger.held() == {}
    finally:
        sub.close()
        if late is not None:
            late.close()


def test_stopping_the_server_closes_its_event_sockets(served):
    server, config = served
    assert stop_server(server) == 0
    ctx = zmq.Context()
    try:
        for endpoint in (config["endpoint"], config["replay_endpoint"]):
            sock = ctx.socket(zmq.PUB)
            sock.bind(endpoint)  # free again
            sock.close(linger=0)
    finally:
        ctx.term()
