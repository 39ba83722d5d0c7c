"""radixkv: an LLM serving runtime built around a radix-tree prefix cache over a paged KV pool."""

from radixkv.errors import (
    CacheInvariantError,
    ConfigError,
    EngineError,
    BackendUnreachable,
    FrontendError,
    InvalidPageError,
    InvalidRequestError,
    ModelLoadError,
    OutOfPagesError,
    RadixKVError,
)

from radixkv.version import __version__


_FRONTEND = ("function", "gen", "select", "system", "user", "assistant", "Runtime", "RuntimeEndpoint",
             "set_default_backend", "ProgramState")


def __getattr__(name: str):
    # heavy imports (torch, transformers) only when the engine is actually used
    if name in _FRONTEND:
        from radixkv import frontend

        return getattr(frontend, name)
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
    *_FRONTEND,
    "Engine",
    "EngineConfig",
    "SamplingParams",
    "BackendUnreachable",
    "CacheInvariantError",
    "FrontendError",
    "ConfigError",
    "EngineError",
    "InvalidPageError",
    "InvalidRequestError",
    "ModelLoadError",
    "OutOfPagesError",
    "RadixKVError",
    "__version__",
]
