"""Page keys of the storage tier: the block hash (`radixkv.mem.block_hash`) of each page.

    key(page 0) = H(seed(identity, namespace) || tokens of page 0)
    key(page i) = H(key(page i-1)            || tokens of page i)

`identity` names what the KV bytes depend on beyond the tokens: the model (its config, and
each weight file's name, size and a hash of slices across it), the KV format, the page size and the pool's tensor layout (`storage_identity`).
So a key means the same KV bytes on every start of every server with that identity, and equal
tokens under two namespaces (cache salts) never share a key. H is the block hash's 16-byte
BLAKE2b: a collision would serve wrong KV, so the hash is cryptographic, not 63 bits wide.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from radixkv.mem import block_hash
from radixkv.mem.block_hash import block_digest, seed_digest

KEY_BYTES = 16
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".gguf", ".pt")


def root_key(identity: bytes, namespace: Any) -> bytes:
    """The chain's seed for one namespace (None: the shared one)."""
    return seed_digest(b"radixkv-root\0" + identity + b"\0" + repr(namespace).encode(), KEY_BYTES)


def next_key(prev: bytes, tokens: Sequence[int]) -> bytes:
    """The key of a page holding `tokens`, after the page keyed `prev` (or the root key)."""
    return block_digest(prev, tokens, KEY_BYTES)


def chain(prev: bytes, tokens: Sequence[int], page_size: int) -> Iterator[bytes]:
    """Keys of the whole pages of `tokens`, continuing after `prev`; lazily, so a caller that
    stops at the first key it does not hold hashes no further."""
    return block_hash.chain(prev, tokens, page_size, KEY_BYTES)


SAMPLE_BYTES = 1 << 16
SAMPLES = 8


def file_fingerprint(path: Path) -> list:
    """A weight file's name, size, and a hash of `SAMPLES` slices of it spread over the whole
    file (about 0.5 MiB read): weights retrained into a file of the same size and name change it."""
    size = path.stat().st_size
    h = hashlib.blake2b(digest_size=16)
    with open(path, "rb") as f:
        for i in range(SAMPLES):
            f.seek(max(0, (size - SAMPLE_BYTES) * i // max(1, SAMPLES - 1)))
            h.update(f.read(SAMPLE_BYTES))
    return [path.name, size, h.hexdigest()]


def model_fingerprint(model_dir: Path) -> dict[str, Any]:
    """What identifies a checkpoint without reading all its weights: config.json's content and
    each weight file's `file_fingerprint`."""
    model_dir = Path(model_dir)
    if model_dir.is_file():  # a single-file checkpoint (GGUF)
        return {"file": file_fingerprint(model_dir)}
    config = model_dir / "config.json"
    weights = sorted(file_fingerprint(p) for p in model_dir.iterdir() if p.suffix in WEIGHT_SUFFIXES)
    return {"config": hashlib.sha256(config.read_bytes()).hexdigest() if config.exists() else None,
            "weights": weights}


def storage_identity(model: dict[str, Any], kv_cache_dtype: str, page_size: int,
                     page_shapes: Sequence[tuple[tuple[int, ...], Any]]) -> bytes:
    """The identity every key of one server's storage tier is seeded with (see the module
    docstring); `page_shapes` is the pool's `(shape per page, dtype)` of each storage tensor."""
    described = {"format": 1, "model": model, "kv_cache_dtype": kv_cache_dtype, "page_size": page_size,
                 "tensors": [[list(shape), str(dtype)] for shape, dtype in page_shapes]}
    return hashlib.sha256(json.dumps(described, sort_keys=True).encode()).digest()[:KEY_BYTES]
