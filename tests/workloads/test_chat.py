import json

import pytest

from radixkv.errors import ConfigError
from radixkv.workloads.chat import ChatTraceConfig, generate_chat_trace, write_trace
from radixkv.workloads.trace import load_trace


def small(**kw):
    return ChatTraceConfig(**{"num_requests": 120, "num_conversations": 20, "seed": 3, **kw})


def test_same_seed_same_trace_and_other_seed_differs():
    assert generate_chat_trace(small()) == generate_chat_trace(small())
    assert generate_chat_trace(small()) != generate_chat_trace(small(seed=4))


def test_each_turn_extends_the_previous_prompt_and_answer():
    records = generate_chat_trace(small())
    last = {}
    for rec in records:
        conv = rec["session_id"]
        if conv in last:
            prev = last[conv]
            assert rec["turn"] == prev["turn"] + 1
            prefix_len = prev["input_length"] + prev["output_length"]
            assert rec["input_ids"][: prev["input_length"]] == prev["input_ids"]
            assert rec["input_length"] > prefix_len
        else:
            assert rec["turn"] == 0
        last[conv] = rec


def test_groups_share_a_system_prompt():
    cfg = small(system_tokens=64, num_groups=2)
    records = generate_chat_trace(cfg)
    by_group = {}
    for rec in records:
        by_group.setdefault(rec["group"], set()).add(tuple(rec["input_ids"][:64]))
    assert len(by_group) == 2 and all(len(v) == 1 for v in by_group.values())
    assert by_group[0] != by_group[1]


def test_popularity_is_skewed_and_arrivals_increase():
    records = generate_chat_trace(small(num_requests=200, num_conversations=40, zipf_alpha=1.2))
    counts = {}
    for rec in records:
        counts[rec["session_id"]] = counts.get(rec["session_id"], 0) + 1
    assert max(counts.values()) >= 3 * (len(records) / len(counts)) or max(counts.values()) == 12
    times = [r["timestamp"] for r in records]
    assert times == sorted(times) and times[-1] > 0


def test_hash_ids_follow_the_mooncake_layout(tmp_path):
    cfg = small(block_size=64)
    records = generate_chat_trace(cfg)
    for rec in records:
        assert len(rec["hash_ids"]) == -(-rec["input_length"] // 64)
    path = tmp_path / "chat.jsonl"
    write_trace(records, path, cfg)
    loaded = load_trace(path)
    assert [r.input_ids for r in loaded] == [tuple(r["input_ids"]) for r in records]
    assert json.loads((tmp_path / "chat.jsonl.config.json").read_text())["block_size"] == 64


def test_bad_config_names_the_field():
    with pytest.raises(ConfigError, match="user_tokens"):
        ChatTraceConfig(user_tokens=(10, 5))
    with pytest.raises(ConfigError, match="cannot make"):
        ChatTraceConfig(num_requests=100, num_conversations=2, max_turns=3)
