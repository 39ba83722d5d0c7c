"""Messages between the server's processes, one dataclass per kind, and one msgpack codec.

Channels (ZMQ PUSH -> PULL, the receiver binds an `ipc://` path in a private directory):

    tokenizer manager --GenerateRequest, AbortMsg, ControlRequest--> scheduler
    scheduler         --TokenBatch-------------------------------->  detokenizer
    detokenizer       --TextBatch--------------------------------->  tokenizer manager
    scheduler         --SchedulerReady, SchedulerFailed, ControlReply--> tokenizer manager

Batches are column-oriented (one list per field, one entry per request), which is what a
step produces and what msgpack packs compactly. On the wire a message is the msgpack array
`[kind, field_1, field_2, ...]`: plain values only, never pickle.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from radixkv.ipc.codec import MessageCodec, ProtocolError

__all__ = ["ProtocolError", "decode", "encode"]


@dataclass(frozen=True, slots=True)
class GenerateRequest:
    """Tokenizer manager -> scheduler: a tokenized, validated request."""

    rid: str
    input_ids: list[int]
    sampling_params: dict[str, Any]  # SamplingParams.to_dict()
    namespace: str | None = None
    logprob: list = field(default_factory=lambda: [False, -1, 0])  # return_logprob, start, top_n


@dataclass(frozen=True, slots=True)
class AbortMsg:
    """Tokenizer manager -> scheduler: stop `rid` (a client disconnected, or asked)."""

    rid: str


@dataclass(frozen=True, slots=True)
class ControlRequest:
    """Tokenizer manager -> scheduler: `kind` is "flush_cache", "stats" or "shutdown"."""

    call_id: str
    kind: str


@dataclass(frozen=True, slots=True)
class ControlReply:
    """Scheduler -> tokenizer manager: the answer to `ControlRequest` `call_id`."""

    call_id: str
    ok: bool
    result: dict[str, Any]


@dataclass(frozen=True, slots=True)
class SchedulerReady:
    """Scheduler -> tokenizer manager, once: the model is loaded; its limits and KV pool."""

    info: dict[str, Any]


@dataclass(frozen=True, slots=True)
class SchedulerFailed:
    """Scheduler -> tokenizer manager, instead of ready: why it could not start."""

    message: str


@dataclass(frozen=True, slots=True)
class TokenBatch:
    """Scheduler -> detokenizer: what one step produced, per request."""

    rids: list[str]
    new_ids: list[list[int]]  # tokens since the request's previous output
    finished: list[bool]
    finish_reasons: list[dict[str, Any] | None]
    prompt_tokens: list[int]
    cached_tokens: list[int]
    completion_tokens: list[int]
    ttft: list[float | None]
    latency: list[float | None]
    errors: list[str | None]
    error_codes: list[int]
    stops: list[list[str]]  # stop strings, for the detokenizer's hold-back
    skip_special_tokens: list[bool]
    output_logprobs: list[list[float] | None]  # per request, as in ReqOutput
    output_top_logprobs: list[list | None]
    input_logprobs: list[list | None]
    input_top_logprobs: list[list | None]


@dataclass(frozen=True, slots=True)
class TextBatch:
    """Detokenizer -> tokenizer manager: a TokenBatch with each request's new text."""

    rids: list[str]
    texts: list[str]  # text since the previous output (stop strings held back and trimmed)
    new_ids: list[list[int]]
    finished: list[bool]
    finish_reasons: list[dict[str, Any] | None]
    prompt_tokens: list[int]
    cached_tokens: list[int]
    completion_tokens: list[int]
    ttft: list[float | None]
    latency: list[float | None]
    errors: list[str | None]
    error_codes: list[int]
    output_logprobs: list[list[float] | None]
    output_top_logprobs: list[list | None]
    input_logprobs: list[list | None]
    input_top_logprobs: list[list | None]


Message = (GenerateRequest | AbortMsg | ControlRequest | ControlReply | SchedulerReady | SchedulerFailed
           | TokenBatch | TextBatch)
_KINDS: tuple[type, ...] = (GenerateRequest, AbortMsg, ControlRequest, ControlReply, SchedulerReady,
                            SchedulerFailed, TokenBatch, TextBatch)
_CODEC = MessageCodec(_KINDS, "radixkv")


def encode(msg: Message) -> bytes:
    """`msg` as msgpack bytes: `[kind, *fields]`."""
    return _CODEC.encode(msg)


def decode(data: bytes) -> Message:
    """The message in `data`; raises `ProtocolError` for anything else."""
    return _CODEC.decode(data)
