"""The wire format of KV cache events: the bytes SGLang's and vLLM's subscribers decode.

One ZMQ message per batch (a scheduler step's events), three frames:

    topic (utf-8)    8-byte big-endian sequence number    msgpack EventBatch

An EventBatch is a positional array `[ts, events, dp_rank]` (wall-clock seconds as a float64;
`dp_rank` is the data-parallel rank, 0 here). Each event is tagged by its class name, in one of
two encodings (`KVEventsConfig.encoding`):

    "map" (default; SGLang and vLLM since they dropped `array_like` from their event structs):
        {"type": "BlockStored", "block_hashes": [...], "parent_block_hash": h | None,
         "token_ids": [...], "block_size": page_size, "lora_id": None, "medium": "GPU",
         "lora_name": None, "namespace": "<16 hex digits>" | None}
        {"type": "BlockRemoved", "block_hashes": [...], "medium": "GPU"}
        {"type": "AllBlocksCleared"}
    "array" (their earlier releases): the same fields in that order, as an array after the tag,
        ["BlockStored", [...], h | None, [...], page_size, None, "GPU", None, namespace]

`namespace` (ours, after the reference fields: their decoders ignore it; left out when None) is
the digest of the blocks' cache namespace (`cache_events.namespace_digest`; None: the shared
one): a tenant's, a salt's or an adapter's blocks are told apart without naming the key or salt.

These are the bytes msgspec writes for the reference structs (`omit_defaults`, tagged; map
keys in field order): every field a decoder requires is present, optional trailing ones are
left out, and a decoder ignores keys and trailing elements it does not know.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgpack

from radixkv.mem.cache_events import (
    AllPagesCleared,
    CacheEvent,
    PagesRemoved,
    PagesStored,
)

END_OF_REPLAY = (-1).to_bytes(8, "big", signed=True)
"""The sequence-number frame of the message that ends a replay (its other frames are empty)."""


def sequence_bytes(seq: int) -> bytes:
    return seq.to_bytes(8, "big")


def event_record(event: CacheEvent, page_size: int, encoding: str = "map") -> dict[str, Any] | list[Any]:
    """One event as the msgpack value SGLang and vLLM publish for it."""
    if isinstance(event, PagesStored):
        fields: dict[str, Any] = {"type": "BlockStored", "block_hashes": event.hashes,
                                  "parent_block_hash": event.parent, "token_ids": event.token_ids,
                                  "block_size": page_size, "lora_id": None, "medium": event.medium,
                                  "lora_name": None}
        if event.namespace is not None:  # (left out when None, as msgspec's omit_defaults leaves defaults)
            fields["namespace"] = event.namespace
    elif isinstance(event, PagesRemoved):
        fields = {"type": "BlockRemoved", "block_hashes": event.hashes, "medium": event.medium}
    elif isinstance(event, AllPagesCleared):
        fields = {"type": "AllBlocksCleared"}
    else:
        raise TypeError(f"not a KV cache event: {event!r}")
    return fields if encoding == "map" else list(fields.values())


def encode_batch(events: Sequence[CacheEvent], ts: float, page_size: int, encoding: str = "map",
                 dp_rank: int = 0) -> bytes:
    """The msgpack EventBatch `[ts, events, dp_rank]` (the third frame of a message)."""
    return msgpack.packb([float(ts), [event_record(e, page_size, encoding) for e in events], dp_rank])


def decode_batch(payload: bytes) -> tuple[float, list[CacheEvent], int | None]:
    """(ts, events, dp_rank) of an EventBatch in either encoding (for subscribers and tests)."""
    batch = msgpack.unpackb(payload)
    ts, records = batch[0], batch[1]
    return ts, [_event(r) for r in records], batch[2] if len(batch) > 2 else None


def _event(record: dict[str, Any] | list[Any]) -> CacheEvent:
    if isinstance(record, dict):
        kind = record["type"]
        get = record.get
    else:
        kind, values = record[0], record[1:]
        names = {"BlockStored": ("block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id",
                                 "medium", "lora_name", "namespace"),
                 "BlockRemoved": ("block_hashes", "medium")}.get(kind, ())
        positional = dict(zip(names, values))
        get = positional.get
    if kind == "BlockStored":
        return PagesStored(list(get("block_hashes")), get("parent_block_hash"), list(get("token_ids")),
                           get("medium"), get("namespace"))
    if kind == "BlockRemoved":
        return PagesRemoved(list(get("block_hashes")), get("medium"))
    if kind == "AllBlocksCleared":
        return AllPagesCleared()
    raise ValueError(f"unknown KV cache event type {kind!r}")
