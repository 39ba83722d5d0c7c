"""What every config group is made of: an option (a field with the help text its CLI flag shows),
a check raising `ConfigError` that names the field, and the named choices the groups validate."""

from __future__ import annotations

from dataclasses import field
from typing import Any

from radixkv.errors import ConfigError

SCHEDULE_POLICIES = ("lpm", "fcfs", "dfs-weight")
LOG_LEVELS = ("debug", "info", "warning", "error")
STORAGE_WRITE_POLICIES = ("write-back", "write-through", "write-through-selective")
STORAGE_PREFETCH_POLICIES = ("auto", "best_effort", "wait_complete", "timeout")
STORAGE_BLOCK_TOKENS = 64  # tokens per stored block by default (rounded up to whole pages)
SPECULATIVE_ALGORITHMS = ("ngram", "radix", "draft")
EVICTION_POLICIES = ("lru", "lfu", "fifo", "reuse", "reuse-cost")
"""The online eviction policies by name (built by `radixkv.mem.eviction.make_policy`)."""


def opt(default: Any, help: str, **flag: Any) -> Any:
    """A config field whose CLI flag says `help`. `flag` holds what the generated flag needs beyond
    its name, type and default: `aliases` (extra spellings), `metavar`, `choices`, `action`,
    `default_in_help` (the help shows the default itself: nothing is appended)."""
    return field(default=default, metadata={"help": help, **flag})


def require(config: object, ok: bool, name: str, why: str) -> None:
    """Raise `ConfigError("name=value: why")` unless `ok`."""
    if not ok:
        raise ConfigError(f"{name}={getattr(config, name)!r}: {why}")


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
