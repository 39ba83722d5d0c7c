import json

import pytest

from radixkv.mem.block_hash import block_ids
from radixkv.workloads.trace import TraceRequest, expand_tokens, load_trace, rehash


def test_expanded_prompts_share_exactly_their_common_leading_blocks():
    a = TraceRequest(0, 1100, 1, (7, 8, 9))
    b = TraceRequest(0, 1500, 1, (7, 8, 10))
    c = TraceRequest(0, 600, 1, (7, 11))
    ka, kb, kc = (expand_tokens(r) for r in (a, b, c))
    assert (len(ka), len(kb), len(kc)) == (1100, 1500, 600)
    common = next(i for i, (x, y) in enumerate(zip(ka, kb)) if x != y)
    assert common == 1024
    assert next(i for i, (x, y) in enumerate(zip(ka, kc)) if x != y) == 512


def test_expansion_rejects_too_few_blocks():
    with pytest.raises(ValueError, match="too few"):
        expand_tokens(TraceRequest(0, 1100, 1, (1, 2)))


def test_load_trace_names_the_bad_line(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text(json.dumps({"input_length": 3, "hash_ids": [1]}) + "\n{\"nope\": 1}\n")
    with pytest.raises(ValueError, match=r"t.jsonl:2"):
        load_trace(path)
    assert len(load_trace(path, limit=1)) == 1
    with pytest.raises(FileNotFoundError, match="missing.jsonl"):
        load_trace(tmp_path / "missing.jsonl")


def test_block_ids_name_equal_prefixes_alike():
    a, b, c = block_ids(None, [1, 2, 3, 4, 5], 2, partial=True)
    assert block_ids(None, [1, 2, 3, 4, 6], 2, partial=True)[:2] == [a, b]
    assert block_ids(None, [1, 2, 3, 4, 6], 2, partial=True)[2] != c
    x, y = block_ids(None, [1, 2, 9, 4], 2, partial=True)
    assert x == a and y not in (b, c)  # same block, other prefix: other id


def test_rehash_recomputes_blocks_from_tokens():
    trace = [TraceRequest(0, 3, 1, (0,), input_ids=(5, 6, 7)),
             TraceRequest(0, 4, 1, (1,), input_ids=(5, 6, 8, 9))]
    out = rehash(trace, 2)
    assert out[1].hash_ids == tuple(block_ids(None, [5, 6, 8, 9], 2))  # the block hash's ids
    assert out[0].hash_ids[0] == out[1].hash_ids[0]
    assert out[0].hash_ids[1] != out[1].hash_ids[1]
