"""The msgpack codec: every message round-trips; anything else is a ProtocolError."""

import msgpack
import pytest

from radixkv.ipc import (
    AbortMsg,
    ControlReply,
    ControlRequest,
    GenerateRequest,
    ProtocolError,
    SchedulerFailed,
    SchedulerReady,
    TextBatch,
    TokenBatch,
    decode,
    encode,
)

MESSAGES = [
    GenerateRequest("r1", [1, 2, 3], {"max_new_tokens": 4, "stop": ["\n"]}, None),
    GenerateRequest("r2", [5], {}, "lora-a", [True, 3, 2]),
    AbortMsg("r1"),
    ControlRequest("c1", "flush_cache"),
    ControlReply("c1", True, {"flushed": False}),
    SchedulerReady({"limits": {"vocab_size": 10}, "page_size": 1}),
    SchedulerFailed("model not found"),
    TokenBatch(["a", "b"], [[1], []], [False, True], [None, {"type": "stop", "matched": "é"}], [3, 4], [0, 2],
               [1, 0], [0.1, None], [None, 0.5], [None, "boom"], [0, 500], [["\n"], []], [True, False],
               [[-0.5], None], [[[[-0.5, 1], [-1.5, 7]]], None], [[[None, 3], [-2.25, 4]], None], [None, None]),
    TextBatch(["a"], ["héllo ✓"], [[7, 8]], [True], [{"type": "length", "length": 2}], [3], [1], [2], [0.01],
              [0.02], [None], [0], [[-0.1, -0.2]], [None], [None], [None]),
]


@pytest.mark.parametrize("msg", MESSAGES, ids=lambda m: type(m).__name__)
def test_every_message_round_trips(msg):
    data = encode(msg)
    assert isinstance(data, bytes) and b"pickle" not in data
    assert decode(data) == msg


@pytest.mark.parametrize("data,match", [
    (b"\xc1", "undecodable"),
    (msgpack.packb([99, "x"]), "unknown message kind"),
    (msgpack.packb(["0", "x"]), "unknown message kind"),
    (msgpack.packb([1]), "takes 1 fields, got 0"),
    (msgpack.packb([1, "a", "b"]), "takes 1 fields, got 2"),
])
def test_malformed_bytes_are_protocol_errors(data, match):
    with pytest.raises(ProtocolError, match=match):
        decode(data)


def test_only_our_messages_can_be_encoded():
    with pytest.raises(ProtocolError, match="not a radixkv message"):
        encode({"rid": "x"})
