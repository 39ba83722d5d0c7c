"""CacheConfig (the KV pool, its prefix cache and host tier) and StorageConfig (the disk tier
below the host tier). Sizes are in tokens unless named otherwise."""

from __future__ import annotations

import math
from dataclasses import dataclass

from radixkv.config.fields import (EVICTION_POLICIES, STORAGE_PREFETCH_POLICIES, STORAGE_WRITE_POLICIES,
                                   opt, require)
from radixkv.config.store_backend import STORAGE_BACKENDS, parse_mooncake, require_mooncake
from radixkv.kv_bytes import KV_CACHE_DTYPES, parse_host_size


@dataclass(frozen=True)
class CacheConfig:
    """The KV pool, the radix prefix cache over it, and the host-memory tier under it."""

    kv_cache_dtype: str = opt("auto", "how the KV pool stores K and V: auto (the model dtype), float32, "
                              "fp16, bf16, fp8_e4m3, fp8_e5m2, int8 (a scale per token and KV head) "
                              "or int4 (a scale and minimum per 16 values); fewer bytes per token hold more "
                              "tokens in the same memory")
    page_size: int = opt(1, "tokens per KV page; prefix matches and eviction are page-aligned")
    max_total_tokens: int | None = opt(None, "KV pool size in tokens (default: kv_mem_fraction of "
                                       "free memory)")
    kv_mem_fraction: float = opt(0.3, "share of free GPU (or host) memory for the KV pool when "
                                 "max_total_tokens is not set")
    eviction_policy: str = opt("lru", "which cached prefixes go first when KV runs short")
    max_cache_retention: float = opt(86400.0, "longest a client's retention hint (Anthropic cache_control "
                                     "ttl, OpenAI prompt_cache_retention / prompt_cache_key) keeps a "
                                     "prefix, in seconds; retained prefixes are evicted only when nothing "
                                     "unretained is left, never blocking admission; 0 ignores every hint",
                                     metavar="SECONDS")
    disable_radix_cache: bool = opt(False, "no prefix sharing: every prompt is computed in full")
    host_kv_size: str | None = opt(None, "host-memory tier for prefixes evicted from the KV pool, in "
                                   "tokens (200000) or bytes (2GiB); a later request copies them back "
                                   "instead of recomputing them (default: off)")
    host_write_policy: str = opt("write-back", "when prefixes reach the host tier: write-back (on "
                                 "eviction) or write-through (as soon as they are cached)")

    def __post_init__(self) -> None:
        def check(ok: bool, name: str, why: str) -> None:
            require(self, ok, name, why)

        check(self.kv_cache_dtype in KV_CACHE_DTYPES, "kv_cache_dtype", f"must be one of {list(KV_CACHE_DTYPES)}")
        check(self.page_size >= 1, "page_size", "must be >= 1")
        check(self.max_total_tokens is None or self.max_total_tokens >= self.page_size,
              "max_total_tokens", "must be at least one page")
        check(0 < self.kv_mem_fraction <= 0.95, "kv_mem_fraction", "must be in (0, 0.95]")
        check(self.eviction_policy in EVICTION_POLICIES, "eviction_policy",
              f"must be one of {sorted(EVICTION_POLICIES)}")
        check(isinstance(self.max_cache_retention, (int, float)) and not isinstance(self.max_cache_retention, bool)
              and math.isfinite(self.max_cache_retention) and self.max_cache_retention >= 0, "max_cache_retention",
              "--max-cache-retention must be a finite number of seconds >= 0 (0 ignores retention hints)")
        if self.host_kv_size is not None:
            parse_host_size(self.host_kv_size)
            check(not self.disable_radix_cache, "host_kv_size", "needs the radix cache (disable_radix_cache is set)")
        check(self.host_write_policy in ("write-back", "write-through"), "host_write_policy",
              "must be write-back or write-through")


@dataclass(frozen=True)
class StorageConfig:
    """The storage tier: pages the host tier lets go, kept as files (found again after a restart)
    or in a Mooncake Store every replica shares. That it needs a host tier and one rank is checked
    by `EngineConfig`, which sees both."""

    kv_storage_dir: str | None = opt(None, "storage tier: a local directory where pages the host tier lets go "
                                     "are kept as files, found again after a restart (needs "
                                     "--host-kv-size; default: off)")
    kv_storage_backend: str = opt("file", "where the storage tier keeps pages: file (--kv-storage-dir) or "
                                  "mooncake (a Mooncake Store shared by every replica: any replica finds what "
                                  "another stored; needs --kv-storage-config and pip install "
                                  "'radixkv[mooncake]')", choices=STORAGE_BACKENDS)
    kv_storage_config: str | None = opt(None, "the backend's settings as a JSON object; mooncake: "
                                        "master_server_address (HOST:PORT, required), metadata_server "
                                        "(P2PHANDSHAKE), protocol (tcp|rdma), device_name, global_segment_size "
                                        "(memory this replica gives the store, 1GiB), local_buffer_size (256MiB), "
                                        "local_hostname", metavar="JSON")
    kv_storage_size: str = opt("16GiB", "the storage tier's budget, in tokens (1000000) or bytes (16GiB); "
                               "its least recently used pages go first")
    kv_storage_write_policy: str | None = opt(None, "when pages reach storage: write-back (when the host "
                                              "tier lets them go), write-through (as soon as they are cached: "
                                              "what other replicas of a shared store need) or "
                                              "write-through-selective (once hit --kv-storage-hit-threshold "
                                              "times); default: write-back for file, write-through for mooncake",
                                              default_in_help=True)
    kv_storage_hit_threshold: int = opt(2, "write-through-selective: hits before a prefix is written to storage")
    kv_storage_block_size: int | None = opt(None, "tokens per block the storage tier stores, reads and checks "
                                            "as one (a multiple of --page-size); default: 64 rounded up to "
                                            "whole pages", metavar="TOKENS")
    kv_storage_prefetch_policy: str = opt("auto", "a request whose prefix continues in storage waits for the "
                                          "read while reading the rest is measured to be cheaper than "
                                          "computing it (auto), is admitted with what has arrived "
                                          "(best_effort), once all of it has (wait_complete), or once it has "
                                          "or the timeout passed (timeout)")
    kv_storage_prefetch_timeout: float = opt(1.0, "prefetch policy timeout: seconds a request waits for its "
                                             "pages from storage")
    kv_storage_persist_timeout: float = opt(30.0, "a clean shutdown writes what the device and host tiers hold "
                                            "to storage for at most this many seconds (logged with what was "
                                            "written); `serve` waits for it beyond --shutdown-timeout")

    def __post_init__(self) -> None:
        def check(ok: bool, name: str, why: str) -> None:
            require(self, ok, name, why)

        parse_host_size(self.kv_storage_size, "kv_storage_size")
        check(self.kv_storage_write_policy is None or self.kv_storage_write_policy in STORAGE_WRITE_POLICIES,
              "kv_storage_write_policy",
              f"must be one of {list(STORAGE_WRITE_POLICIES)}")
        check(isinstance(self.kv_storage_hit_threshold, int) and self.kv_storage_hit_threshold >= 1,
              "kv_storage_hit_threshold", "must be an integer >= 1")
        check(self.kv_storage_block_size is None or (isinstance(self.kv_storage_block_size, int)
                                                     and 1 <= self.kv_storage_block_size <= 4096),
              "kv_storage_block_size", "must be an integer in [1, 4096] tokens")
        check(self.kv_storage_prefetch_policy in STORAGE_PREFETCH_POLICIES, "kv_storage_prefetch_policy",
              f"must be one of {list(STORAGE_PREFETCH_POLICIES)}")
        check(isinstance(self.kv_storage_prefetch_timeout, (int, float)) and
              math.isfinite(self.kv_storage_prefetch_timeout) and self.kv_storage_prefetch_timeout >= 0,
              "kv_storage_prefetch_timeout", "must be a finite number of seconds >= 0")
        check(isinstance(self.kv_storage_persist_timeout, (int, float)) and
              0 <= self.kv_storage_persist_timeout <= 3600, "kv_storage_persist_timeout",
              "must be in [0, 3600] seconds")
        check(self.kv_storage_dir is None or bool(str(self.kv_storage_dir).strip()), "kv_storage_dir",
              "must name a directory")
        check(self.kv_storage_backend in STORAGE_BACKENDS, "kv_storage_backend", f"must be one of {list(STORAGE_BACKENDS)}")
        if self.kv_storage_backend == "mooncake":
            check(self.kv_storage_dir is None, "kv_storage_dir", "is the file backend's; the mooncake backend keeps "
                  "pages in the Mooncake Store (drop one of --kv-storage-dir and --kv-storage-backend mooncake)")
            parse_mooncake(self.kv_storage_config)
            require_mooncake()
        else:
            check(self.kv_storage_config is None, "kv_storage_config", "is for --kv-storage-backend mooncake")

    @property
    def enabled(self) -> bool:
        """Whether a storage tier is asked for (a directory, or a shared store)."""
        return self.kv_storage_dir is not None or self.kv_storage_backend == "mooncake"

    @property
    def write_policy(self) -> str:
        """The write policy in effect (the default depends on the backend)."""
        if self.kv_storage_write_policy is not None:
            return self.kv_storage_write_policy
        return "write-through" if self.kv_storage_backend == "mooncake" else "write-back"
