"""radixkv: an LLM serving runtime built around a radix-tree prefix cache over a paged KV pool."""

from radixkv.errors import (
    CacheInvariantError,
    ConfigError,
    EngineError,
    InvalidPageError,
    InvalidRequestError,
    ModelLoadError,
    OutOfPagesError,
    RadixKVError,
)

__version__ = "0.1.0"


def __getattr__(name: str):
    # heavy imports (torch, transformers) only when the engine is actually used
    if name == "Engine":
        from radixkv.engine import Engine

        return Engine
    if name == "SamplingParams":
        from radixkv.sampling_params import SamplingParams

        return SamplingParams
    if name == "EngineConfig":
        from radixkv.config import EngineConfig

        return EngineConfig
    raise AttributeError(f"module 'radixkv' has no attribute {name!r}")

__all__ = [
    "Engine",
    "EngineConfig",
    "SamplingParams",
    "CacheInvariantError",
    "ConfigError",
    "EngineError",
    "InvalidPageError",
    "InvalidRequestError",
    "ModelLoadError",
    "OutOfPagesError",
    "RadixKVError",
    "__version__",
]
