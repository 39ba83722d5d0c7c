"""EngineConfig: every knob of the runtime, frozen and validated at start-up.

Values named "auto" are resolved against the machine by the properties below (`torch_device`,
`torch_dtype`, `attention_backend_name`), never by mutating the config.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

import torch

from radixkv.errors import ConfigError

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
SCHEDULE_POLICIES = ("lpm", "fcfs", "dfs-weight")
LOG_LEVELS = ("debug", "info", "warning", "error")


@dataclass(frozen=True)
class EngineConfig:
    """Configuration of one engine (model runner + scheduler + caches).

    Sizes are in tokens unless named otherwise.
    """

    model: str | None = None  # model directory or .gguf file; None = embedded SmolLM2-135M-Instruct
    cache_dir: str | None = None  # where converted models live (default ~/.cache/radixkv)
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    dtype: str = "auto"  # auto (float32 on CPU, bfloat16 on CUDA) | float32 | float16 | bfloat16
    attention_backend: str = "auto"  # auto (torch on CPU, triton on CUDA) | torch | triton
    page_size: int = 1  # tokens per KV page
    max_total_tokens: int | None = None  # KV pool size; None = kv_mem_fraction of free memory
    kv_mem_fraction: float = 0.3  # share of free (GPU or host) memory for the KV pool
    max_running_requests: int = 64  # concurrent requests (rows of the request table)
    context_length: int | None = None  # max prompt + output tokens; None = the model's maximum
    chunked_prefill_size: int = 2048  # max new prompt tokens of one request per forward; 0 = off
    max_prefill_tokens: int = 8192  # max new prompt tokens of one extend batch
    schedule_policy: str = "lpm"  # lpm | fcfs | dfs-weight
    eviction_policy: str = "lru"  # see radixkv.mem.POLICIES
    disable_radix_cache: bool = False  # no prefix sharing (every prompt is computed in full)
    starvation_limit: int = 32  # lpm: a request passed over this many times goes first
    retract_decode_steps: int = 32  # decode steps of headroom reserved per running request
    seed: int = 0  # seed of the shared sampling generator
    log_level: str = "info"

    def __post_init__(self) -> None:
        def check(ok: bool, name: str, why: str) -> None:
            if not ok:
                raise ConfigError(f"{name}={getattr(self, name)!r}: {why}")

        check(self.device == "auto" or self.device == "cpu" or self.device.startswith("cuda"),
              "device", "must be auto, cpu, cuda or cuda:N")
        if self.device.startswith("cuda") and not torch.cuda.is_available():
            raise ConfigError(f"device={self.device!r}: CUDA is not available on this machine")
        check(self.dtype == "auto" or self.dtype in DTYPES, "dtype", f"must be auto or one of {list(DTYPES)}")
        check(self.attention_backend in ("auto", "torch", "triton"), "attention_backend",
              "must be auto, torch or triton")
        check(self.page_size >= 1, "page_size", "must be >= 1")
        check(self.max_total_tokens is None or self.max_total_tokens >= self.page_size,
              "max_total_tokens", "must be at least one page")
        check(0 < self.kv_mem_fraction <= 0.95, "kv_mem_fraction", "must be in (0, 0.95]")
        check(self.max_running_requests >= 1, "max_running_requests", "must be >= 1")
        check(self.context_length is None or self.context_length >= 2, "context_length", "must be >= 2")
        check(self.chunked_prefill_size == 0 or self.chunked_prefill_size >= self.page_size,
              "chunked_prefill_size", "must be 0 (off) or at least one page")
        check(self.max_prefill_tokens >= 1, "max_prefill_tokens", "must be >= 1")
        check(self.schedule_policy in SCHEDULE_POLICIES, "schedule_policy", f"must be one of {SCHEDULE_POLICIES}")
        from radixkv.mem.eviction import POLICIES

        check(self.eviction_policy in POLICIES, "eviction_policy", f"must be one of {sorted(POLICIES)}")
        check(self.starvation_limit >= 1, "starvation_limit", "must be >= 1")
        check(self.retract_decode_steps >= 1, "retract_decode_steps", "must be >= 1")
        check(self.log_level in LOG_LEVELS, "log_level", f"must be one of {LOG_LEVELS}")

    # -- resolved values -------------------------------------------------------------------------
    @property
    def torch_device(self) -> torch.device:
        if self.device == "auto":
            return torch.device("cuda" if torch.cuda.is_available() else "cpu")
        return torch.device(self.device)

    @property
    def torch_dtype(self) -> torch.dtype:
        if self.dtype == "auto":
            # bf16 matmuls are slow on CPUs without AVX-512/AMX; fp32 is the CPU default
            return torch.bfloat16 if self.torch_device.type == "cuda" else torch.float32
        return DTYPES[self.dtype]

    @property
    def attention_backend_name(self) -> str:
        if self.attention_backend == "auto":
            return "triton" if self.torch_device.type == "cuda" else "torch"
        return self.attention_backend

    @classmethod
    def from_kwargs(cls, **kwargs: Any) -> EngineConfig:
        """Build from keyword arguments; an unknown name is an error listing the valid ones."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(kwargs) - known)
        if unknown:
            raise ConfigError(f"unknown engine option(s) {unknown}; valid options: {sorted(known)}")
        return cls(**kwargs)
