"""EngineConfig: every knob of one engine (model runner + scheduler + caches), frozen and
validated at start-up, as one group per concern.

Each group validates its own fields; what spans groups (the storage tier needs a host tier,
speculative decoding one rank) is checked here. Options keep flat names everywhere a user writes
them (`--max-running-requests`, `radixkv.Engine(max_running_requests=...)`): `from_kwargs` routes
each name to its group, and code reads it through the group (`config.scheduler.max_running_requests`).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Any

from radixkv.config.cache import CacheConfig, StorageConfig
from radixkv.config.disagg import DisaggConfig
from radixkv.config.lora import LoRAConfig
from radixkv.config.runtime import RuntimeConfig
from radixkv.config.scheduling import GrammarConfig, SchedulerConfig, SpeculativeConfig
from radixkv.config.telemetry import TelemetryConfig
from radixkv.errors import ConfigError


def _group(cls: type, title: str) -> Any:
    return field(default_factory=cls, metadata={"title": title})


@dataclass(frozen=True)
class EngineConfig:
    """Configuration of one engine, grouped; build one from flat option names with `from_kwargs`."""

    runtime: RuntimeConfig = _group(RuntimeConfig, "model and runtime")
    cache: CacheConfig = _group(CacheConfig, "KV cache")
    storage: StorageConfig = _group(StorageConfig, "KV storage tier")
    scheduler: SchedulerConfig = _group(SchedulerConfig, "scheduling")
    spec: SpeculativeConfig = _group(SpeculativeConfig, "speculative decoding")
    grammar: GrammarConfig = _group(GrammarConfig, "constrained decoding")
    telemetry: TelemetryConfig = _group(TelemetryConfig, "telemetry")
    disagg: DisaggConfig = _group(DisaggConfig, "prefill and decode disaggregation")
    lora: LoRAConfig = _group(LoRAConfig, "LoRA adapters")

    def __post_init__(self) -> None:
        for f in fields(self):
            group = getattr(self, f.name)
            if not isinstance(group, GROUPS[f.name]):
                raise ConfigError(f"EngineConfig.{f.name} must be a {GROUPS[f.name].__name__}, got "
                                  f"{type(group).__name__}; give flat options to EngineConfig.from_kwargs")
        runtime, cache, storage, scheduler = self.runtime, self.cache, self.storage, self.scheduler
        if scheduler.chunked_prefill_size != 0 and scheduler.chunked_prefill_size < cache.page_size:
            raise ConfigError(f"chunked_prefill_size={scheduler.chunked_prefill_size!r}: "
                              f"must be 0 (off) or at least one page")
        if storage.enabled:
            what = (f"kv_storage_dir={storage.kv_storage_dir!r}" if storage.kv_storage_dir is not None
                    else f"kv_storage_backend={storage.kv_storage_backend!r}")
            if cache.host_kv_size is None:
                raise ConfigError(f"{what}: needs a host tier (--host-kv-size): "
                                  "pages reach storage from the host tier and come back through it")
            block = storage.kv_storage_block_size
            if block is not None and block % cache.page_size:
                raise ConfigError(f"kv_storage_block_size={block!r}: must be a multiple of page_size "
                                  f"({cache.page_size})")
            if runtime.tp_size != 1:
                raise ConfigError(f"{what}: is not supported with tp_size > 1 yet")
        if self.disagg.enabled:
            what = f"disaggregation_mode={self.disagg.disaggregation_mode!r}"
            if runtime.tp_size != 1:
                raise ConfigError(f"{what}: is not supported with tp_size > 1 yet")
            if cache.disable_radix_cache:
                raise ConfigError(f"{what}: needs the radix cache (pages travel from and into the tree); "
                                  "drop --disable-radix-cache")
        if self.lora.enabled:
            if runtime.tp_size != 1:
                raise ConfigError("enable_lora: is not supported with tp_size > 1 yet")
            if self.spec.speculative_algorithm == "draft":
                raise ConfigError("enable_lora: does not combine with speculative_algorithm='draft' (the draft "
                                  "model has no adapters)")
        if self.spec.speculative_algorithm is not None and runtime.tp_size != 1:
            raise ConfigError(f"speculative_algorithm={self.spec.speculative_algorithm!r}: "
                              "does not combine with tp_size > 1 yet")

    @classmethod
    def from_kwargs(cls, **options: Any) -> EngineConfig:
        """Build from flat option names (`page_size=16`), each routed to its group; an unknown name
        is an error listing the valid ones."""
        per_group = _per_group(options)
        return cls(**{name: group(**per_group.get(name, {})) for name, group in GROUPS.items()})

    def with_options(self, **options: Any) -> EngineConfig:
        """This config with the flat options given changed (what `dataclasses.replace` did when
        the fields were flat), validated again."""
        return replace(self, **{name: replace(getattr(self, name), **kw) for name, kw in _per_group(options).items()})

    def to_kwargs(self) -> dict[str, Any]:
        """Every option by its flat name: what `from_kwargs` takes back (and JSON can carry)."""
        return {name: getattr(getattr(self, group), name) for name, group in OPTION_GROUPS.items()}


GROUPS: dict[str, type] = {f.name: f.default_factory for f in fields(EngineConfig)}
"""EngineConfig's groups: attribute name -> group class."""

OPTION_GROUPS: dict[str, str] = {option.name: name for name, cls in GROUPS.items() for option in fields(cls)}
"""Every flat option name -> the attribute of the group holding it (`"page_size": "cache"`)."""


def _per_group(options: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Flat `options` sorted into keyword dicts per group attribute."""
    unknown = sorted(set(options) - set(OPTION_GROUPS))
    if unknown:
        raise ConfigError(f"unknown engine option(s) {unknown}; valid options: {sorted(OPTION_GROUPS)}")
    per_group: dict[str, dict[str, Any]] = {}
    for name, value in options.items():
        per_group.setdefault(OPTION_GROUPS[name], {})[name] = value
    return per_group
