"""Configuration: `EngineConfig` (one group per concern, each a frozen dataclass validating
itself), `ServerConfig` (`radixkv serve`'s own options), `RouterConfig` (`radixkv router`'s)
and `KVEventsConfig`.

    runtime    RuntimeConfig      model, device, dtype, attention backend, threads, compile, tp_size
    cache      CacheConfig        KV pool, page size, eviction, retention, host tier
    storage    StorageConfig      the disk tier under the host tier (kv_storage_*)
    scheduler  SchedulerConfig    admission, batch sizes, chunked prefill, policy, seed
    spec       SpeculativeConfig  speculative decoding (speculative_*)
    grammar    GrammarConfig      one grammar compile's time and memory budget
    telemetry  TelemetryConfig    logs, timeline, request trace, KV events
    disagg     DisaggConfig       prefill/decode disaggregation (disaggregation_*)
    lora       LoRAConfig         LoRA adapters (enable_lora, lora_*, max_lora*)

Option names stay flat where users write them (CLI flags, `radixkv.Engine(**options)`,
`EngineConfig.from_kwargs`); code reads them through their group: `config.cache.page_size`.
"""

from radixkv.config.cache import CacheConfig, StorageConfig
from radixkv.config.disagg import DisaggConfig
from radixkv.config.lora import LoRAConfig
from radixkv.config.engine import GROUPS, OPTION_GROUPS, EngineConfig
from radixkv.config.fields import (EVICTION_POLICIES, LOG_LEVELS, SCHEDULE_POLICIES, SPECULATIVE_ALGORITHMS,
                                   STORAGE_PREFETCH_POLICIES, STORAGE_WRITE_POLICIES)
from radixkv.config.kv_events import KV_EVENT_ENCODINGS, KV_EVENTS_IGNORED_KEYS, KVEventsConfig
from radixkv.config.router import ROUTING_POLICIES, RouterConfig
from radixkv.config.runtime import COMPILE_DEFAULT, DTYPES, RuntimeConfig
from radixkv.config.scheduling import GrammarConfig, SchedulerConfig, SpeculativeConfig
from radixkv.config.server import ServerConfig
from radixkv.config.telemetry import TelemetryConfig

__all__ = [
    "COMPILE_DEFAULT", "DTYPES", "EVICTION_POLICIES", "GROUPS", "KV_EVENTS_IGNORED_KEYS", "KV_EVENT_ENCODINGS",
    "LOG_LEVELS", "OPTION_GROUPS", "ROUTING_POLICIES", "SCHEDULE_POLICIES", "SPECULATIVE_ALGORITHMS", "STORAGE_PREFETCH_POLICIES",
    "STORAGE_WRITE_POLICIES", "CacheConfig", "DisaggConfig", "EngineConfig", "GrammarConfig", "KVEventsConfig", "LoRAConfig", "RouterConfig", "RuntimeConfig",
    "SchedulerConfig", "ServerConfig", "SpeculativeConfig", "StorageConfig", "TelemetryConfig",
]
