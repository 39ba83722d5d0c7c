"""The block hash: one chained hash naming a block of tokens together with its whole prefix.

    root(namespace) = H("radixkv-root" || the namespace, as its repr)
    hash(block i)   = H(hash(block i-1) || the block's token ids, each a little-endian int64)

H is 16-byte BLAKE2b: a collision would serve wrong KV, so the hash is cryptographic. It is
the one name radixkv gives a block, wherever the block is named:

- the storage tier keys its pages by it (`radixkv.mem.disk_storage`, which keeps each model's
  and KV format's pages apart by the storage identity in its file names, not in the hash);
- the KV events announce `block_id(hash)` (`radixkv.mem.cache_events`);
- a recorded trace lists `block_id(hash)` of each prompt block (`radixkv.sched.trace_recorder`),
  and the planner names the blocks of a chat workload the same way (`radixkv.workloads.trace`).

So a block recorded in a trace is the block the store holds and the event announces. The ids
carry no secret: whoever can guess a prompt's tokens can confirm it from them, as from KV events.
Equal tokens under two namespaces (cache salt, LoRA adapter, tenant) never share a hash.
"""

from __future__ import annotations

import sys
from array import array
from collections.abc import Iterator, Sequence
from functools import lru_cache
from hashlib import blake2b
from typing import Any

DIGEST_BYTES = 16
ID_MASK = (1 << 63) - 1
_BIG_ENDIAN = sys.byteorder == "big"
_ROOT_TAG = b"radixkv-root\0"


@lru_cache(maxsize=4096)
def root(namespace: Any) -> bytes:
    """The chain's seed for `namespace` (None: the shared one). A namespace is a string, an
    int or a tuple of them: their repr is the same in every process."""
    return blake2b(_ROOT_TAG + repr(namespace).encode(), digest_size=DIGEST_BYTES).digest()


def block(prev: bytes, tokens: Sequence[int]) -> bytes:
    """The hash of a block of `tokens` after the block (or root) hashed `prev`."""
    ids = array("q", tokens)
    if _BIG_ENDIAN:
        ids.byteswap()
    return blake2b(prev + ids.tobytes(), digest_size=DIGEST_BYTES).digest()


def chain(prev: bytes, tokens: Sequence[int], block_size: int, partial: bool = False) -> Iterator[bytes]:
    """Hashes of the blocks of `tokens` (whole blocks; with `partial`, a last partial one too),
    continuing after `prev`; lazily, so a caller that stops at the first one it does not hold
    hashes no further."""
    end = len(tokens) if partial else len(tokens) - block_size + 1
    for start in range(0, end, block_size):
        prev = block(prev, tokens[start:start + block_size])
        yield prev


def block_id(digest: bytes) -> int:
    """The hash's first 8 bytes, little-endian, as a non-negative 63-bit integer: the same
    number read as a signed (SGLang) or an unsigned (vLLM) 64-bit one."""
    return int.from_bytes(digest[:8], "little") & ID_MASK


def block_ids(namespace: Any, tokens: Sequence[int], block_size: int, partial: bool = False) -> list[int]:
    """`block_id` of each block of `tokens` from the start of `namespace`'s chain."""
    return [block_id(d) for d in chain(root(namespace), tokens, block_size, partial)]
