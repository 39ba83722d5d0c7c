"""EngineConfig as groups: each group refuses a bad value of its own naming the field, EngineConfig
checks what spans groups, and flat option names (the CLI's, `radixkv.Engine`'s) reach their group."""

from dataclasses import fields

import pytest

from radixkv.config import (GROUPS, OPTION_GROUPS, CacheConfig, EngineConfig, GrammarConfig, RuntimeConfig,
                            SchedulerConfig, SpeculativeConfig, StorageConfig, TelemetryConfig)
from radixkv.errors import ConfigError


@pytest.mark.parametrize("group,field,value", [
    (RuntimeConfig, "device", "tpu"),
    (RuntimeConfig, "dtype", "float8"),
    (RuntimeConfig, "num_threads", 0),
    (RuntimeConfig, "tp_size", 0),
    (CacheConfig, "page_size", 0),
    (CacheConfig, "kv_mem_fraction", 1.5),
    (CacheConfig, "eviction_policy", "mru"),
    (CacheConfig, "host_write_policy", "never"),
    (StorageConfig, "kv_storage_write_policy", "always"),
    (StorageConfig, "kv_storage_hit_threshold", 0),
    (StorageConfig, "kv_storage_prefetch_timeout", -1.0),
    (StorageConfig, "kv_storage_block_size", 0),
    (SchedulerConfig, "max_running_requests", 0),
    (SchedulerConfig, "schedule_policy", "random"),
    (SchedulerConfig, "context_length", 1),
    (SchedulerConfig, "hold_finished_seconds", -1),
    (SpeculativeConfig, "speculative_algorithm", "eagle"),
    (SpeculativeConfig, "speculative_num_draft_tokens", 17),
    (GrammarConfig, "grammar_compile_timeout", 0),
    (GrammarConfig, "grammar_compile_memory", "lots"),
    (TelemetryConfig, "log_level", "chatty"),
    (TelemetryConfig, "record_trace_block_size", 0),
    (TelemetryConfig, "kv_events_config", '{"publisher": "kafka"}'),
])
def test_each_group_refuses_a_bad_value_naming_the_field(group, field, value):
    with pytest.raises(ConfigError, match=f"^{field}[=:]"):
        group(**{field: value})
    with pytest.raises(ConfigError, match=f"^{field}[=:]"):  # the same through the flat names
        EngineConfig.from_kwargs(**{field: value})


def test_a_group_checks_its_fields_together():
    with pytest.raises(ConfigError, match="max_total_tokens=3: must be at least one page"):
        CacheConfig(page_size=4, max_total_tokens=3)
    with pytest.raises(ConfigError, match="host_kv_size"):
        CacheConfig(host_kv_size="1000", disable_radix_cache=True)
    with pytest.raises(ConfigError, match="speculative_draft_model_path"):
        SpeculativeConfig(speculative_algorithm="draft")


def test_engine_config_checks_what_spans_groups(tmp_path):
    with pytest.raises(ConfigError, match="kv_storage_dir=.*needs a host tier"):
        EngineConfig(storage=StorageConfig(kv_storage_dir=str(tmp_path)))
    EngineConfig(cache=CacheConfig(host_kv_size="1000"), storage=StorageConfig(kv_storage_dir=str(tmp_path)))
    with pytest.raises(ConfigError, match="chunked_prefill_size=8: must be 0 \\(off\\) or at least one page"):
        EngineConfig.from_kwargs(page_size=16, chunked_prefill_size=8)
    assert EngineConfig.from_kwargs(page_size=16, chunked_prefill_size=0).scheduler.chunked_prefill_size == 0
    with pytest.raises(ConfigError, match="speculative_algorithm='ngram': does not combine with tp_size > 1"):
        EngineConfig.from_kwargs(speculative_algorithm="ngram", tp_size=2)


def test_from_kwargs_routes_each_flat_name_to_its_group():
    config = EngineConfig.from_kwargs(page_size=4, max_running_requests=3, log_level="debug",
                                      speculative_algorithm="ngram", grammar_compile_memory="512MiB")
    assert config.cache.page_size == 4 and config.scheduler.max_running_requests == 3
    assert config.telemetry.log_level == "debug" and config.spec.speculative_algorithm == "ngram"
    assert config.grammar.grammar_compile_memory_bytes == 512 << 20
    assert config.runtime == RuntimeConfig()  # untouched groups keep their defaults
    assert EngineConfig.from_kwargs(**config.to_kwargs()) == config
    with pytest.raises(ConfigError, match=r"unknown engine option\(s\) \['pagesize'\]; valid options: .*'page_size'"):
        EngineConfig.from_kwargs(pagesize=16)


def test_every_option_name_belongs_to_exactly_one_group():
    names = [option.name for group in GROUPS.values() for option in fields(group)]
    assert len(names) == len(set(names)) == len(OPTION_GROUPS) == 60  # (41 + hold_finished_seconds, kv_storage_persist_timeout, kv_storage_block_size, kv_storage_backend, kv_storage_config, nnodes, node_rank, dist_init_addr, the six disaggregation_*, the five LoRA options)
    assert not set(names) & set(GROUPS)  # `config.cache` is never mistaken for an option
    assert all(OPTION_GROUPS[option.name] == name for name, group in GROUPS.items() for option in fields(group))


def test_with_options_changes_flat_names_and_validates_again():
    config = EngineConfig.from_kwargs(max_total_tokens=64)
    changed = config.with_options(page_size=8, model="/m")
    assert (changed.cache.page_size, changed.cache.max_total_tokens, changed.runtime.model) == (8, 64, "/m")
    assert config.cache.page_size == 1  # frozen: the original is untouched
    with pytest.raises(ConfigError, match="max_total_tokens=64: must be at least one page"):
        config.with_options(page_size=128)


def test_a_group_given_as_flat_values_is_refused_pointing_at_from_kwargs():
    with pytest.raises(ConfigError, match="from_kwargs"):
        EngineConfig(cache={"page_size": 4})
