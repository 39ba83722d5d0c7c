"""Where radixkv keeps what it derives on this machine: converted models, compiled forwards,
tokenizer records (`cache_root`)."""

from __future__ import annotations

import os
from pathlib import Path


def cache_root(cache_dir: str | Path | None = None) -> Path:
    """`cache_dir`, else $RADIXKV_CACHE_DIR, else ~/.cache/radixkv."""
    if cache_dir is not None:
        return Path(cache_dir).expanduser()
    env = os.environ.get("RADIXKV_CACHE_DIR")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "radixkv"
