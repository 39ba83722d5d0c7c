"""radixkv: an LLM serving runtime built around a radix-tree prefix cache over a paged KV pool."""

from radixkv.errors import (
    CacheInvariantError,
    ConfigError,
    InvalidPageError,
    InvalidRequestError,
    ModelLoadError,
    OutOfPagesError,
    RadixKVError,
)

__version__ = "0.1.0"

__all__ = [
    "CacheInvariantError",
    "ConfigError",
    "InvalidPageError",
    "InvalidRequestError",
    "ModelLoadError",
    "OutOfPagesError",
    "RadixKVError",
    "__version__",
]
