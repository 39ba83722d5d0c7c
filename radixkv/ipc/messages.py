"""Messages between the server's processes, one dataclass per kind, and one msgpack codec.

Channels (ZMQ PUSH -> PULL, the receiver binds an `ipc://` path in a private directory):

    tokenizer manager --GenerateRequest, AbortMsg, ControlRequest--> scheduler
    scheduler         --DetokenizeParams, TokenBatch-------------->  detokenizer
    detokenizer       --TextBatch--------------------------------->  tokenizer manager
    scheduler         --SchedulerReady, SchedulerFailed, ControlReply--> tokenizer manager

Requests and outputs travel as their own records (`SamplingParams`, `ReqOutput`, `TextOutput`),
field by field in the order they define; on the wire a message is the msgpack array
`[kind, field_1, field_2, ...]`: plain values only, never pickle.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from radixkv.ipc.codec import MessageCodec, ProtocolError, record, records
from radixkv.outputs import ReqOutput, TextOutput
from radixkv.bootstrap import Bootstrap
from radixkv.retention import Retention
from radixkv.sampling_params import LogprobParams, SamplingParams

__all__ = ["ProtocolError", "decode", "encode"]


@dataclass(frozen=True, slots=True)
class GenerateRequest:
    """Tokenizer manager -> scheduler: a tokenized, validated request (`retention`: how long the
    client asks its prefixes to stay cached, before the scheduler's cap; None: no hint)."""

    rid: str
    input_ids: list[int]
    params: SamplingParams = record(SamplingParams)
    namespace: str | None = None
    logprob: LogprobParams = record(LogprobParams, default=LogprobParams())
    retention: Retention | None = record(Retention, default=None)
    bootstrap: Bootstrap | None = record(Bootstrap, default=None)  # its prefill/decode pair's room
    lora: str | None = None  # the id of the LoRA adapter it runs under (None: the base model)


@dataclass(frozen=True, slots=True)
class AbortMsg:
    """Tokenizer manager -> scheduler: stop `rid` (a client disconnected, or asked)."""

    rid: str


CACHE_TREE_MAX_NODES = 2000


@dataclass(frozen=True, slots=True)
class ControlRequest:
    """Tokenizer manager -> scheduler: `kind` is "flush_cache", "stats", "cache_tree" (the top
    `CACHE_TREE_MAX_NODES` nodes, `radixkv.mem.tree_view`), "load_lora", "unload_lora",
    "lora_adapters" or "shutdown". `viewer`: whose
    nodes a "cache_tree" shows (`radixkv.tenancy.visible`; None: all)."""

    call_id: str
    kind: str
    viewer: str | None = None
    args: dict[str, Any] | None = None  # the call's arguments ("load_lora": lora_name, lora_path)


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
class DetokenizeParams:
    """Scheduler -> detokenizer, once per request, before its first output: how to turn its
    tokens into text (stop strings are held back and trimmed; special tokens kept or skipped)."""

    rid: str
    stops: list[str]
    skip_special_tokens: bool
    trim_stop: bool = True  # false: SGLang's no_stop_trim
    spaces_between_special_tokens: bool = True

    @classmethod
    def of(cls, rid: str, params: SamplingParams) -> DetokenizeParams:
        return cls(rid, list(params.stop), params.skip_special_tokens, not params.no_stop_trim,
                   params.spaces_between_special_tokens)


@dataclass(frozen=True, slots=True)
class TokenBatch:
    """Scheduler -> detokenizer: what one step produced, one output per request."""

    outputs: list[ReqOutput] = records(ReqOutput)


@dataclass(frozen=True, slots=True)
class TextBatch:
    """Detokenizer -> tokenizer manager: the step's outputs with their new text."""

    outputs: list[TextOutput] = records(TextOutput)


Message = (GenerateRequest | AbortMsg | ControlRequest | ControlReply | SchedulerReady | SchedulerFailed
           | DetokenizeParams | TokenBatch | TextBatch)
_KINDS: tuple[type, ...] = (GenerateRequest, AbortMsg, ControlRequest, ControlReply, SchedulerReady,
                            SchedulerFailed, DetokenizeParams, TokenBatch, TextBatch)
_CODEC = MessageCodec(_KINDS, "radixkv")


def encode(msg: Message) -> bytes:
    """`msg` as msgpack bytes: `[kind, *fields]`."""
    return _CODEC.encode(msg)


def decode(data: bytes) -> Message:
    """The message in `data`; raises `ProtocolError` for anything else."""
    return _CODEC.decode(data)
