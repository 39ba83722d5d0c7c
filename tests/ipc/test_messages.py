"""The msgpack codec: every message round-trips; anything else is a ProtocolError."""

import msgpack
import pytest

from radixkv.ipc import (
    AbortMsg,
    ControlReply,
    ControlRequest,
    DetokenizeParams,
    GenerateRequest,
    ProtocolError,
    SchedulerFailed,
    SchedulerReady,
    TextBatch,
    TokenBatch,
    decode,
    encode,
)
from radixkv.errors import ErrorKind
from radixkv.outputs import ReqOutput, TextOutput
from radixkv.retention import WHOLE, Retention
from radixkv.sampling_params import LogprobParams, SamplingParams

MESSAGES = [
    GenerateRequest("r1", [1, 2, 3], SamplingParams(max_new_tokens=4, stop=("\n",)), None),
    GenerateRequest("r2", [5], SamplingParams(json_schema={"type": "object"}), "lora-a", LogprobParams(True, 3, 2)),
    GenerateRequest("r3", [5, 6], SamplingParams(), None, LogprobParams(), Retention(((1024, 3600.0), (WHOLE, 300.0)))),
    AbortMsg("r1"),
    ControlRequest("c1", "flush_cache"),
    ControlReply("c1", True, {"flushed": False}),
    SchedulerReady({"limits": {"vocab_size": 10}, "page_size": 1}),
    SchedulerFailed("model not found"),
    DetokenizeParams("a", ["\n"], True),
    TokenBatch([ReqOutput("a", [1], False, None, 3, 0, 1, 0.1, None, output_logprobs=[-0.5],
                          output_top_logprobs=[[[-0.5, 1], [-1.5, 7]]], input_logprobs=[[None, 3], [-2.25, 4]]),
                ReqOutput("b", [], True, {"type": "stop", "matched": "é"}, 4, 2, 0, None, 0.5, "boom",
                          ErrorKind.INTERNAL)]),
    TextBatch([TextOutput("a", [7, 8], True, {"type": "length", "length": 2}, 3, 1, 2, 0.01, 0.02,
                          output_logprobs=[-0.1, -0.2], text="héllo ✓")]),
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


def test_a_request_with_invalid_values_names_itself():
    """A GenerateRequest whose parameters do not validate is a ProtocolError that still says
    which request it was, so the scheduler can answer it instead of dropping it."""
    row = SamplingParams(max_new_tokens=4).to_row()
    row[0] = -4  # max_new_tokens
    with pytest.raises(ProtocolError, match="max_new_tokens") as caught:
        decode(msgpack.packb([0, "r9", [1, 2], row, None, [False, -1, 0], None, None, None]))
    assert caught.value.kind is GenerateRequest and caught.value.values[0] == "r9"


@pytest.mark.parametrize("retention,match", [([[WHOLE, -5.0]], "seconds"), ([[-3, 60.0]], "tokens"),
                                             ([[1, 2, 3]], "malformed")])
def test_a_request_with_an_invalid_retention_names_itself(retention, match):
    row = SamplingParams().to_row()
    with pytest.raises(ProtocolError, match=match) as caught:
        decode(msgpack.packb([0, "r9", [1, 2], row, None, [False, -1, 0], retention, None, None]))
    assert caught.value.kind is GenerateRequest and caught.value.values[0] == "r9"


def test_only_our_messages_can_be_encoded():
    with pytest.raises(ProtocolError, match="not a radixkv message"):
        encode({"rid": "x"})
