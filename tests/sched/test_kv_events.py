"""KV cache events (`--kv-events-config`): the config, the bytes on the wire (what SGLang's and
vLLM's subscribers decode), the publisher's PUB and replay sockets, and the offline Engine
publishing the pages its tree holds."""

import json
from typing import Any

import msgpack
import pytest
import zmq

from radixkv.config import EngineConfig, KVEventsConfig
from radixkv.errors import ConfigError
from radixkv.mem.cache_events import (
    CPU,
    GPU,
    AllPagesCleared,
    PageLedger,
    PagesRemoved,
    PagesStored,
    tree_events,
)
from radixkv.sched.kv_event_wire import decode_batch, encode_batch
from radixkv.sched.kv_events import KVEventPublisher
from tests.kv_events_helpers import Subscriber, free_port

EVENTS = [PagesStored([11, 2**63 - 1], None, [1, 2, 3, 4], GPU), PagesStored([12], 11, [5, 6], CPU),
          PagesRemoved([11], GPU), AllPagesCleared()]


def zmq_config(**keys: Any) -> KVEventsConfig:
    return KVEventsConfig.parse(json.dumps({"publisher": "zmq", "endpoint": f"tcp://*:{free_port()}",
                                            "replay_endpoint": f"tcp://*:{free_port()}", "topic": "kv", **keys}))


# -- the config -----------------------------------------------------------------------------------
def test_the_config_takes_sglang_and_vllm_json():
    sglang = KVEventsConfig.parse('{"publisher": "zmq", "endpoint": "tcp://*:5557", "topic": "kv-events", '
                                  '"replay_endpoint": "tcp://*:5558", "buffer_steps": 10000, "hwm": 100000, '
                                  '"max_queue_size": 100000, "format": "dynamo", "bind": null}')
    assert sglang.enabled and sglang.binds and sglang.replay_endpoint == "tcp://*:5558"
    vllm = KVEventsConfig.parse('{"enable_kv_cache_events": true, "topic": "kv-events"}')
    assert vllm.enabled and vllm.endpoint == "tcp://*:5557"
    assert not KVEventsConfig.parse('{"publisher": "null"}').enabled and not KVEventsConfig.parse(None).enabled
    assert not KVEventsConfig.parse('{"endpoint": "tcp://10.0.0.2:5557"}').binds  # a concrete host: connect
    rank2 = KVEventsConfig.parse('{"endpoint": "tcp://*:5557", "replay_endpoint": "tcp://*:5558"}').for_rank(2)
    assert (rank2.endpoint, rank2.replay_endpoint) == ("tcp://*:5559", "tcp://*:5560")
    assert KVEventsConfig.parse(rank2.to_json()) == rank2


@pytest.mark.parametrize("text, named", [
    ('{"publisher": "zmq", "bogus": 1, "other": 2}', "unknown key(s) ['bogus', 'other']"),
    ('{"publisher": "kafka"}', "publisher='kafka'"), ('{"hwm": -1}', "hwm=-1"),
    ('{"buffer_steps": "many"}', "buffer_steps='many'"), ('{"endpoint": "http://x:1"}', "endpoint="),
    ('{"encoding": "json"}', "encoding='json'"), ('{"format": "x"}', "format='x'"),
    ('{"enable_kv_cache_events": false, "publisher": "zmq"}', "contradicts"),
    ('{"publisher": "zmq"', "not valid JSON"), ('["zmq"]', "must be a JSON object"),
])
def test_a_bad_config_is_refused_naming_the_key(text, named):
    with pytest.raises(ConfigError, match="kv_events_config") as e:
        EngineConfig.from_kwargs(kv_events_config=text)
    assert named in str(e.value)


def test_serve_exits_with_the_message_before_loading_anything(run_cli):
    done = run_cli("serve", "--kv-events-config", '{"publisher": "zmq", "hwm": "lots"}')
    assert done.returncode == 2 and "kv_events_config: hwm='lots'" in done.stderr


# -- the wire -------------------------------------------------------------------------------------
def test_map_encoding_is_sglangs_and_vllms_current_layout():
    ts, records, rank = msgpack.unpackb(encode_batch(EVENTS, 1.5, page_size=2))
    assert (ts, rank) == (1.5, 0)
    stored, cpu, removed, cleared = records
    assert list(stored) == ["type", "block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id",
                            "medium", "lora_name"]
    assert stored == {"type": "BlockStored", "block_hashes": [11, 2**63 - 1], "parent_block_hash": None,
                      "token_ids": [1, 2, 3, 4], "block_size": 2, "lora_id": None, "medium": "GPU",
                      "lora_name": None}
    assert cpu["parent_block_hash"] == 11 and cpu["medium"] == "CPU"
    assert removed == {"type": "BlockRemoved", "block_hashes": [11], "medium": "GPU"}
    assert cleared == {"type": "AllBlocksCleared"}


def test_array_encoding_is_the_older_positional_layout():
    _, records, _ = msgpack.unpackb(encode_batch(EVENTS, 1.5, page_size=2, encoding="array"))
    assert records == [["BlockStored", [11, 2**63 - 1], None, [1, 2, 3, 4], 2, None, "GPU", None],
                       ["BlockStored", [12], 11, [5, 6], 2, None, "CPU", None],
                       ["BlockRemoved", [11], "GPU"], ["AllBlocksCleared"]]


@pytest.mark.parametrize("encoding", ["map", "array"])
def test_our_decoder_reads_back_either_encoding(encoding):
    assert decode_batch(encode_batch(EVENTS, 2.0, 2, encoding)) == (2.0, EVENTS, 0)


def test_the_bytes_are_msgspecs_for_the_reference_structs():
    msgspec = pytest.importorskip("msgspec", reason="msgspec (the references' codec) is not installed here")
    from typing import Union

    def structs(array_like: bool, lora_name_required: bool, with_lora_name: bool = True):
        class KVCacheEvent(msgspec.Struct, array_like=array_like, omit_defaults=True, tag=True):
            pass

        fields = {"block_hashes": list[int], "parent_block_hash": int | None, "token_ids": list[int],
                  "block_size": int, "lora_id": int | None, "medium": str | None}
        stored_ns: dict = {"__annotations__": dict(fields)}
        if with_lora_name:
            stored_ns["__annotations__"]["lora_name"] = str | None
            if not lora_name_required:
                stored_ns["lora_name"] = None
        stored = type("BlockStored", (KVCacheEvent,), stored_ns)
        removed = type("BlockRemoved", (KVCacheEvent,), {"__annotations__": {"block_hashes": list[int],
                                                                             "medium": str | None}})
        cleared = type("AllBlocksCleared", (KVCacheEvent,), {})

        class EventBatch(msgspec.Struct, array_like=True):
            ts: float
            events: list[Union[stored, removed, cleared]]  # noqa: UP007
            dp_rank: int | None = None

        return EventBatch, stored, removed, cleared

    def as_structs(kinds):
        batch, stored, removed, cleared = kinds
        out = [stored(e.hashes, e.parent, e.token_ids, 2, None, e.medium, None) if isinstance(e, PagesStored)
               else removed(e.hashes, e.medium) if isinstance(e, PagesRemoved) else cleared() for e in EVENTS]
        return batch(1.5, out, 0)

    vllm_map, vllm_array = structs(False, True), structs(True, True)  # lora_name required, as vLLM has it
    for kinds, encoding in ((vllm_map, "map"), (vllm_array, "array")):
        ours = encode_batch(EVENTS, 1.5, 2, encoding)
        assert msgspec.msgpack.encode(as_structs(kinds)) == ours
        assert msgspec.msgpack.decode(ours, type=kinds[0]) == as_structs(kinds)
    sglang_map = structs(False, False)  # lora_name (and later fields) optional
    decoded = msgspec.msgpack.decode(encode_batch(EVENTS, 1.5, 2), type=sglang_map[0])
    assert [type(e).__name__ for e in decoded.events] == ["BlockStored", "BlockStored", "BlockRemoved",
                                                          "AllBlocksCleared"]
    legacy = structs(True, True, with_lora_name=False)  # vLLM's example subscriber: 6 fields
    assert msgspec.msgpack.decode(encode_batch(EVENTS, 1.5, 2, "array"), type=legacy[0]).events[0].medium == "GPU"


def test_sglangs_own_decoder_reads_our_batches():
    sglang = pytest.importorskip("sglang.srt.disaggregation.kv_events", reason="sglang is not installed here")
    msgspec = pytest.importorskip("msgspec")
    batch = msgspec.msgpack.decode(encode_batch(EVENTS, 1.5, 2), type=sglang.KVEventBatch)
    stored, cpu, removed, cleared = batch.events
    assert (batch.ts, batch.attn_dp_rank) == (1.5, 0)
    assert (stored.block_hashes, stored.parent_block_hash, stored.token_ids, stored.block_size, stored.medium) == (
        [11, 2**63 - 1], None, [1, 2, 3, 4], 2, "GPU")
    assert (cpu.parent_block_hash, cpu.medium) == (11, "CPU")
    assert isinstance(removed, sglang.BlockRemoved) and removed.block_hashes == [11]
    assert isinstance(cleared, sglang.AllBlocksCleared)


def test_a_store_names_its_namespace_by_digest_and_sglang_still_reads_it():
    """Each block carries its namespace's digest (tenants told apart, no key or salt shown)."""
    from radixkv.mem.cache_events import namespace_digest

    space = namespace_digest("principal:abc")
    assert len(space) == 16 and "abc" not in space and namespace_digest(None) is None
    events = [PagesStored([11], None, [1, 2], GPU, space)]
    (stored,) = msgpack.unpackb(encode_batch(events, 1.0, 2))[1]
    assert stored["namespace"] == space
    (row,) = msgpack.unpackb(encode_batch(events, 1.0, 2, "array"))[1]
    assert row[-1] == space
    for encoding in ("map", "array"):
        assert decode_batch(encode_batch(events, 1.0, 2, encoding))[1] == events
    sglang = pytest.importorskip("sglang.srt.disaggregation.kv_events", reason="sglang is not installed here")
    msgspec = pytest.importorskip("msgspec")
    decoded = msgspec.msgpack.decode(encode_batch(events, 1.0, 2), type=sglang.KVEventBatch).events[0]
    assert decoded.block_hashes == [11]


# -- the publisher --------------------------------------------------------------------------------
@pytest.fixture
def publisher():
    made = []

    def make(**keys: Any) -> KVEventPublisher:
        made.append(KVEventPublisher(zmq_config(**keys), page_size=2))
        return made[-1]

    yield make
    for p in made:
        p.close()


def test_a_wildcard_binds_loopback_unless_exposed_and_exposing_warns(publisher, caplog):
    """Issue 41: `tcp://*` (the README's example) opened every tenant's token ids, and the
    replay socket, to the network, with no credential."""
    with caplog.at_level("WARNING"):
        quiet = publisher()
    assert quiet.endpoint.startswith("tcp://127.0.0.1:") and quiet.replay_endpoint.startswith("tcp://127.0.0.1:")
    assert "beyond this machine" not in caplog.text
    with caplog.at_level("WARNING"):
        wide = publisher(expose=True)
    assert wide.endpoint.startswith("tcp://0.0.0.0:") and "every tenant's token ids" in caplog.text
    config = KVEventsConfig(endpoint="tcp://[::]:5557")
    assert config.bind_address(config.endpoint) == "tcp://[::1]:5557" and not config.exposed(config.endpoint)
    assert KVEventsConfig(endpoint="tcp://10.0.0.5:5557").exposed("tcp://10.0.0.5:5557")


def test_batches_go_out_in_sequence_and_replay_resends_the_same_bytes(publisher):
    pub = publisher()
    info = pub.describe()
    sub = Subscriber(info["endpoint"], info["replay_endpoint"], "kv", 2)
    try:
        for i in range(3):
            pub.publish([PagesStored([100 + i], 100 + i - 1 if i else None, [i, i], GPU)])
        sub.catch_up(3)  # what came before the subscription took hold, by replay
        assert sub.ledger.held() == {100: (None, (0, 0), frozenset({GPU})), 101: (100, (1, 1), frozenset({GPU})),
                                     102: (101, (2, 2), frozenset({GPU}))}
        pub.publish([PagesRemoved([102], GPU)])
        sub.catch_up(4)
        answer = sub.replay(1)
        assert [seq for seq, _ in answer] == [1, 2, 3] and answer[-1][1] == sub.live[3]
        assert sub.replay(4) == []  # nothing newer: only the end marker
        assert 102 not in sub.ledger.held()
    finally:
        sub.close()


def test_a_start_older_than_the_buffer_gets_the_whole_tree(publisher):
    pub = publisher(buffer_steps=2)
    stream = [[PagesStored([1, 2], None, [1, 1, 2, 2], GPU)], [PagesStored([3], 2, [3, 3], GPU)],
              [PagesStored([1, 2], None, [1, 1, 2, 2], CPU), PagesRemoved([3], GPU)], [PagesRemoved([2], GPU)]]
    for events in stream:
        pub.publish(events)
    late = Subscriber(pub.describe()["endpoint"], pub.describe()["replay_endpoint"], "kv", 2)
    try:
        ((seq, payload),) = late.replay(0)
        assert seq == len(stream) - 1  # the tree as of the last batch: go on from the next live one
        _, events, _ = decode_batch(payload)
        assert isinstance(events[0], AllPagesCleared)
        assert late.ledger.held() == PageLedger(2).apply_all(e for batch in stream for e in batch).held() == {
            1: (None, (1, 1), frozenset({GPU, CPU})), 2: (1, (2, 2), frozenset({CPU}))}
        assert [s for s, _ in late.replay(2)] == [2, 3]  # still in the buffer: the batches themselves
    finally:
        late.close()


def test_a_busy_endpoint_is_a_config_error_naming_it(publisher):
    first = publisher()
    with pytest.raises(ConfigError, match="endpoint='tcp://.*cannot bind"):
        KVEventPublisher(KVEventsConfig(publisher="zmq", endpoint=first.config.endpoint), 2)


def test_close_stops_the_thread_and_frees_the_ports():
    pub = KVEventPublisher(zmq_config(), 2)
    pub.publish([AllPagesCleared()])
    pub.close()
    assert not pub._thread.is_alive() and pub.published_batches == 1
    again = KVEventPublisher(pub.config, 2)  # the same ports bind again at once
    again.close()


def test_a_replay_request_from_a_req_socket_is_answered(publisher):
    pub = publisher()
    pub.publish([AllPagesCleared()])
    ctx = zmq.Context()
    req = ctx.socket(zmq.REQ)
    req.connect(pub.describe()["replay_endpoint"].replace("0.0.0.0", "127.0.0.1"))
    try:
        req.send((0).to_bytes(8, "big"))
        assert req.poll(5000)
        topic, seq, payload = req.recv_multipart()  # REQ takes the first reply only
        assert (topic, seq) == (b"kv", bytes(8)) and decode_batch(payload)[1] == [AllPagesCleared()]
    finally:
        ctx.destroy(linger=0)


# -- the offline Engine ---------------------------------------------------------------------------
def test_the_engine_publishes_what_its_tree_holds_through_evictions_and_a_flush(tiny_engine):
    port, replay = free_port(), free_port()
    config = {"publisher": "zmq", "endpoint": f"tcp://127.0.0.1:{port}", "bind": True,
              "replay_endpoint": f"tcp://127.0.0.1:{replay}", "topic": "kv", "buffer_steps": 3}
    engine = tiny_engine(page_size=4, max_total_tokens=96, host_kv_size="32", compile="off",
                         kv_events_config=json.dumps(config))
    info = engine.core.kv_events.describe()
    sub = Subscriber(info["endpoint"], info["replay_endpoint"], "kv", 4)
    cache = engine.core.cache
    system = list(range(10, 34))
    try:
        for tails in ([[100, 101, 102]], [[100, 101, 103, 104], [200, 7, 8, 9, 10, 11]], [list(range(400, 460))]):
            engine.generate(input_ids=[system + t for t in tails], sampling_params={"max_new_tokens": 6})
            sub.catch_up(engine.get_stats()["kv_event_batches"])
            assert sub.ledger.held() == PageLedger(4).apply_all(tree_events(cache)).held()
        mediums = {m for _, _, ms in sub.ledger.held().values() for m in ms}
        assert mediums == {GPU, CPU} and engine.get_stats()["evicted_tokens"] > 0
        gpu = sum(GPU in ms for _, _, ms in sub.ledger.held().values())
        assert gpu * 4 == engine.get_stats()["cached_tokens_in_tree"]
        late = Subscriber(info["endpoint"], info["replay_endpoint"], "kv", 4)
        late.catch_up(engine.get_stats()["kv_event_batches"])  # from 0: older than the buffer
        ((_, tree),) = late.replays[0]
        assert isinstance(decode_batch(tree)[1][0], AllPagesCleared)
        assert late.ledger.held() == sub.ledger.held()
        late.close()
        assert engine.flush_cache()
        sub.catch_up(engine.get_stats()["kv_event_batches"])
        assert sub.ledger.held() == {}
    finally:
        sub.close()
    engine.shutdown()
    KVEventPublisher(KVEventsConfig.parse(json.dumps(config)), 4).close()  # shut down: the ports are free
