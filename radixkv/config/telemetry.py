"""TelemetryConfig: what the runtime tells about itself: logs, a timeline of forwards, a trace of
the requests served, KV cache events for routers."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from radixkv.config.fields import LOG_LEVELS, opt, require
from radixkv.config.kv_events import KVEventsConfig


@dataclass(frozen=True)
class TelemetryConfig:
    """Logs, timeline, request trace and KV events."""

    timeline_file: str | None = opt(None, "append a JSON-lines timeline here: one line per forward (what it "
                                    "ran, how long) and per finished request (queued, scheduled, first token, "
                                    "finished), to see where time to first token goes (default: off)")
    record_trace: str | None = opt(None, "write every request served here, in the Mooncake trace format "
                                   "(timestamps, lengths and prefix-block hash ids, no text), for "
                                   "`radixkv plan` and trace replays; the file is overwritten (default: off)")
    record_trace_block_size: int = opt(16, "tokens per hash id in a --record-trace trace: sharing finer "
                                       "than a block is not seen by a replay, so keep it at most the page "
                                       "size you plan for (Mooncake's own traces use 512)")
    kv_events_config: str | None = opt(None, "publish KV cache events (pages stored, removed, cleared, per "
                                       "tier) for KV-aware routers, in the JSON SGLang and vLLM take: "
                                       "'{\"publisher\": \"zmq\", \"endpoint\": \"tcp://*:5557\", \"topic\": "
                                       "\"kv-events\", \"replay_endpoint\": \"tcp://*:5558\", \"buffer_steps\": "
                                       "10000, \"hwm\": 100000}'; each step's events go out as one msgpack batch "
                                       "[topic, sequence number, batch] on a ZMQ PUB socket; a late subscriber asks "
                                       "the replay ROUTER socket from a sequence number (older than the buffer: the "
                                       "whole tree); \"encoding\": \"array\" packs events as positional arrays "
                                       "for older subscribers (default: off)")
    log_level: str = opt("info", "debug, info, warning or error (debug also checks cache "
                         "invariants after every step)")

    def __post_init__(self) -> None:
        def check(ok: bool, name: str, why: str) -> None:
            require(self, ok, name, why)

        check(isinstance(self.record_trace_block_size, int) and self.record_trace_block_size >= 1,
              "record_trace_block_size", "must be a positive integer")
        check(self.record_trace is None or bool(str(self.record_trace).strip()), "record_trace", "must name a file")
        if self.record_trace is not None:  # (found before the model loads, not after)
            parent = Path(self.record_trace).expanduser().resolve().parent
            check(parent.is_dir() and os.access(parent, os.W_OK), "record_trace",
                  f"cannot write there: {parent} is not a writable directory")
        check(self.log_level in LOG_LEVELS, "log_level", f"must be one of {LOG_LEVELS}")
        check(self.kv_events_config is None or isinstance(self.kv_events_config, str), "kv_events_config",
              "must be a JSON object in a string")
        KVEventsConfig.parse(self.kv_events_config)  # raises naming the key at fault

    @property
    def kv_events(self) -> KVEventsConfig:
        """The parsed `kv_events_config` (publisher "null" when unset)."""
        return KVEventsConfig.parse(self.kv_events_config)
