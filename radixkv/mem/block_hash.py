"""The block hash: one chained hash naming a block of tokens together with its whole prefix.

    digest(root)    = H(seed material of the chain: what the KV depends on, and the namespace)
    digest(block i) = H(digest(block i-1) || the block's token ids, each as a little-endian int64)

H is BLAKE2b with a `size`-byte digest, optionally keyed. One construction serves every name
radixkv gives a block; they differ only in what seeds the chain and how wide it is:

- storage keys (`radixkv.mem.page_keys`): 16 bytes (a collision would serve wrong KV, so the
  hash is cryptographic), the root seeded with the storage identity (model, KV format, page
  size, pool layout) and the namespace;
- KV events (`radixkv.mem.cache_events`): 8 bytes read as a 63-bit integer, whose 8 bytes chain
  on, so a subscriber recomputes a page's hash from its parent's (the wire format SGLang and
  vLLM routers decode); the default namespace's root is 0;
- recorded traces (`radixkv.sched.trace_recorder`): 16 bytes keyed with a per-recording secret,
  read as 63-bit ids, so ids say which prompts share prefixes and nothing about their tokens.
"""

from __future__ import annotations

import sys
from array import array
from collections.abc import Iterator, Sequence
from hashlib import blake2b

ID_MASK = (1 << 63) - 1
BIG_ENDIAN = sys.byteorder == "big"


def block_digest(prev: bytes, tokens: Sequence[int], size: int = 16, key: bytes = b"") -> bytes:
    """The digest of a block of `tokens` after the block (or root) whose digest is `prev`."""
    ids = array("q", tokens)
    if BIG_ENDIAN:
        ids.byteswap()
    return blake2b(prev + ids.tobytes(), digest_size=size, key=key).digest()


def seed_digest(material: bytes, size: int = 16, key: bytes = b"") -> bytes:
    """A chain's root digest, from the `material` that seeds it."""
    return blake2b(material, digest_size=size, key=key).digest()


def chain(prev: bytes, tokens: Sequence[int], block_size: int, size: int = 16, key: bytes = b"",
          partial: bool = False) -> Iterator[bytes]:
    """Digests of the blocks of `tokens` (whole blocks; with `partial`, a last partial one too),
    continuing after `prev`; lazily, so a caller that stops at the first one it does not hold
    hashes no further."""
    end = len(tokens) if partial else len(tokens) - block_size + 1
    for start in range(0, end, block_size):
        prev = block_digest(prev, tokens[start:start + block_size], size, key)
        yield prev


def block_id(digest: bytes, byteorder: str = "little") -> int:
    """The digest's first 8 bytes as a non-negative 63-bit integer (the same number read as a
    signed or an unsigned 64-bit one)."""
    return int.from_bytes(digest[:8], byteorder) & ID_MASK


def id_chain(parent: int, tokens: Sequence[int], block_size: int) -> Iterator[int]:
    """The KV events' form: 63-bit block ids chained on the ids themselves (each id's 8 bytes,
    little-endian, are the next block's `prev`), from `parent` (an id or a namespace's root)."""
    for start in range(0, len(tokens), block_size):
        digest = block_digest(parent.to_bytes(8, "little"), tokens[start:start + block_size], 8)
        parent = int.from_bytes(digest, "big") >> 1
        yield parent
