"""The storage identity: what a server's stored KV bytes depend on beyond the tokens.

The model (its config, and each weight file's name, size and a hash of slices across it), the
KV format, the page size and the pool's tensor layout. The storage tier keeps pages of one
identity apart from every other's (`radixkv.mem.disk_storage` puts it in each file's name), so
a page is served only to a server that would have computed the same bytes; the page's own key
is its block hash (`radixkv.mem.block_hash`).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

IDENTITY_BYTES = 16
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".gguf", ".pt")
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
    described = {"format": 2, "model": model, "kv_cache_dtype": kv_cache_dtype, "page_size": page_size,
                 "tensors": [[list(shape), str(dtype)] for shape, dtype in page_shapes]}
    return hashlib.sha256(json.dumps(described, sort_keys=True).encode()).digest()[:IDENTITY_BYTES]
