"""Inter-process messages: typed dataclasses per ZMQ channel and their msgpack codec."""

from radixkv.ipc.messages import (
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

__all__ = ["AbortMsg", "ControlReply", "ControlRequest", "DetokenizeParams", "GenerateRequest", "ProtocolError",
           "SchedulerFailed", "SchedulerReady", "TextBatch", "TokenBatch", "decode", "encode"]
