"""Mooncake-format request traces: loading, and expanding block hashes into token ids.

One JSON object a line: `timestamp` (ms), `input_length`, `output_length`, `hash_ids` (the
prompt as a chain of `block_size`-token blocks, each id naming its whole prefix), and, in
traces we generate ourselves, optional `input_ids` / `session_id` / `turn` fields; a server's
recorded trace names the LoRA adapter a request ran under (`adapter`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from itertools import chain
from pathlib import Path

from radixkv.mem.block_hash import block_ids

BLOCK_SIZE = 512


@dataclass(frozen=True, slots=True)
class TraceRequest:
    timestamp: float  # ms since the first request
    input_length: int  # prompt tokens
    output_length: int  # completion tokens
    hash_ids: tuple[int, ...]  # prefix-block ids, ceil(input_length / block_size) of them
    input_ids: tuple[int, ...] | None = None  # real token ids, when the trace has them
    session_id: int | None = None
    adapter: str | None = None  # the LoRA adapter it ran under (None: the base model)
    extra: dict = field(default_factory=dict)


def load_trace(path: str | Path, limit: int | None = None) -> list[TraceRequest]:
    """Read a JSONL trace; errors name the file and line at fault."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"trace file not found: {path}")
    out: list[TraceRequest] = []
    with path.open() as f:
        for lineno, line in enumerate(f, 1):
            if limit is not None and len(out) >= limit:
                break
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
                req = TraceRequest(
                    timestamp=float(obj.get("timestamp", 0)),
                    input_length=int(obj["input_length"]),
                    output_length=int(obj.get("output_length", 0)),
                    hash_ids=tuple(int(h) for h in obj["hash_ids"]),
                    input_ids=tuple(obj["input_ids"]) if "input_ids" in obj else None,
                    session_id=obj.get("session_id"),
                    adapter=None if obj.get("adapter") is None else str(obj["adapter"]),
                )
            except (KeyError, TypeError, ValueError) as e:
                raise ValueError(f"{path}:{lineno}: not a trace record ({e!r})") from None
            out.append(req)
    return out


_OFFSETS = tuple(range(1, BLOCK_SIZE))


def expand_tokens(req: TraceRequest, block_size: int = BLOCK_SIZE) -> tuple[int, ...]:
    """Synthetic token ids for a tokenizer-free replay: `input_length` of them, from `hash_ids`.

    Block `h` becomes `(h, 1, 2, ..., block_size - 1)`: its first token carries the block's
    prefix id, so two prompts share exactly the tokens of their common leading blocks, and the
    remaining tokens are shared int objects (the full trace then fits in memory). Comparisons in
    the tree are positional, so offset tokens never meet block ids. The last block is truncated.
    """
    offsets = _OFFSETS if block_size == BLOCK_SIZE else tuple(range(1, block_size))
    key = tuple(chain.from_iterable(part for h in req.hash_ids for part in ((h,), offsets)))
    if len(key) < req.input_length:
        raise ValueError(
            f"trace request has {len(req.hash_ids)} block id(s) of {block_size} tokens, "
            f"too few for input_length={req.input_length}"
        )
    return key[: req.input_length]


def rehash(trace: Sequence[TraceRequest], block_size: int) -> list[TraceRequest]:
    """The trace with `hash_ids` recomputed from its `input_ids` at `block_size` granularity.

    A cache with pages of `block_size` tokens can share exactly these blocks, so replaying the
    rehashed trace gives the same hits as replaying the real tokens. The ids are the block
    hashes' (`radixkv.mem.block_hash.block_ids`), as a server's recorded trace has them.
    """
    out = []
    for req in trace:
        if req.input_ids is None:
            raise ValueError("rehash needs a trace with input_ids")
        out.append(replace(req, hash_ids=tuple(block_ids(None, req.input_ids, block_size, partial=True))))
    return out
