"""The messages between a decode server and its prefill server's bootstrap port (ZMQ, msgpack).

A decode server's DEALER socket sends `PullPages` (and `CancelPull` when it gives up); the prefill
server's ROUTER answers each room once, with `Pushed` or `PullFailed`.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from radixkv.ipc.codec import MessageCodec, ProtocolError


@dataclass(frozen=True, slots=True)
class PullPages:
    """Decode -> prefill: write the pages of `room`'s prompt tokens [start, end) into my pool.

    `identity`: the storage identity of my model, KV format, page size and pool layout (yours
    must be equal); `digest`: `prompt_digest` of the prompt's first `end` tokens and namespace
    (yours must be equal); `session`: my transfer engine; `buffers`: the base address of each of
    my pool's storage tensors; `pages`: my page for each page of [start, end); `wait`: seconds I
    wait (begin no write later than that after this arrives)."""

    room: int
    identity: bytes
    digest: bytes
    session: str
    buffers: list[int]
    start: int
    end: int
    pages: list[int]
    wait: float


@dataclass(frozen=True, slots=True)
class CancelPull:
    """Decode -> prefill: I gave up on `room` (timed out, or its client left): write nothing more."""

    room: int


@dataclass(frozen=True, slots=True)
class Pushed:
    """Prefill -> decode: `room`'s pages are in your pool (`tokens` tokens, `nbytes` bytes, in
    `seconds` of transfer)."""

    room: int
    tokens: int
    nbytes: int
    seconds: float


@dataclass(frozen=True, slots=True)
class PullFailed:
    """Prefill -> decode: `room` gets no pages (`message` says why); nothing was or will be written."""

    room: int
    message: str


CODEC = MessageCodec((PullPages, CancelPull, Pushed, PullFailed), "disaggregation")
__all__ = ["CODEC", "CancelPull", "ProtocolError", "PullFailed", "PullPages", "Pushed", "prompt_digest"]


def prompt_digest(tokens: Sequence[int], namespace: Any) -> bytes:
    """What both sides must agree on for a transfer: these prompt tokens, in this cache namespace."""
    h = hashlib.blake2b(digest_size=16)
    h.update(repr(namespace).encode())
    h.update(b"\0")
    h.update(b"".join(int(t).to_bytes(4, "little", signed=True) for t in tokens))
    return h.digest()
