"""KVEventsConfig: where KV cache events are published (`--kv-events-config`), parsed from the
JSON SGLang and vLLM take."""

from __future__ import annotations

import json
from dataclasses import dataclass, fields, replace

from radixkv.errors import ConfigError

KV_EVENT_ENCODINGS = ("map", "array")
"""How each event is packed: "map" (a tagged msgpack map, what SGLang and vLLM publish and their
current subscribers decode) or "array" (a tagged positional array: their older releases)."""
KV_EVENT_SCHEMES = ("tcp://", "ipc://")  # (inproc:// would reach no one: the publisher has its own context)
KV_EVENTS_IGNORED_KEYS = {
    "max_queue_size": "radixkv hands batches to its publisher thread without a bounded queue",
    "format": "radixkv folds every namespace (LoRA, salt) into its page hashes, as SGLang's 'dynamo' format does",
}
"""Keys SGLang or vLLM define that change nothing here: accepted (their values still checked),
so a config written for them works as is."""


@dataclass(frozen=True)
class KVEventsConfig:
    """`--kv-events-config`: where KV cache events (pages stored, removed, cleared) are
    published, in the JSON SGLang and vLLM take. Parse one with `KVEventsConfig.parse`.

    Publishing is on when `publisher` is "zmq"; left out, it follows vLLM's
    `enable_kv_cache_events` (true: "zmq"), else it is "null" (off).
    """

    publisher: str = "null"  # "zmq" or "null"
    endpoint: str = "tcp://*:5557"  # the PUB socket: bound for a wildcard host or ipc://, else connected
    replay_endpoint: str | None = None  # the ROUTER socket late subscribers ask (always bound)
    topic: str = ""  # the first frame of every message
    buffer_steps: int = 10_000  # batches kept for replay; an older start gets the whole tree instead
    hwm: int = 100_000  # ZMQ high-water mark of the PUB socket, in messages
    bind: bool | None = None  # bind (true) or connect (false) the PUB socket; None: by the endpoint
    encoding: str = "map"  # radixkv's own key: one of KV_EVENT_ENCODINGS
    # radixkv's own key: a wildcard host (tcp://*:PORT, 0.0.0.0, ::) binds every interface only
    # when true; else loopback. The events carry every tenant's token ids (docs: Security model).
    expose: bool = False

    def __post_init__(self) -> None:
        def check(ok: bool, key: str, why: str) -> None:
            if not ok:
                raise ConfigError(f"kv_events_config: {key}={getattr(self, key)!r}: {why}")

        check(self.publisher in ("null", "zmq"), "publisher", "must be 'zmq' or 'null' (off)")
        check(isinstance(self.endpoint, str) and self.endpoint.startswith(KV_EVENT_SCHEMES), "endpoint",
              "must be a ZMQ address: tcp://HOST:PORT or ipc://PATH")
        check(self.replay_endpoint is None or (isinstance(self.replay_endpoint, str)
                                               and self.replay_endpoint.startswith(KV_EVENT_SCHEMES)),
              "replay_endpoint", "must be a ZMQ address (tcp://HOST:PORT or ipc://PATH) or null")
        check(self.replay_endpoint is None or self.replay_endpoint != self.endpoint, "replay_endpoint",
              "must differ from endpoint")
        check(isinstance(self.topic, str), "topic", "must be a string")
        for key in ("buffer_steps", "hwm"):
            value = getattr(self, key)
            check(isinstance(value, int) and not isinstance(value, bool) and value >= 0, key,
                  "must be an integer >= 0")
        check(self.bind is None or isinstance(self.bind, bool), "bind", "must be true, false or null")
        check(isinstance(self.expose, bool), "expose", "must be true or false")
        check(self.encoding in KV_EVENT_ENCODINGS, "encoding", f"must be one of {list(KV_EVENT_ENCODINGS)}")

    @property
    def enabled(self) -> bool:
        return self.publisher == "zmq"

    @property
    def binds(self) -> bool:
        """Whether the PUB socket binds `endpoint` (else it connects to a subscriber that binds)."""
        if self.bind is not None:
            return self.bind
        host = self.endpoint.removeprefix("tcp://").rpartition(":")[0]
        return not self.endpoint.startswith("tcp://") or host in ("*", "0.0.0.0", "::", "[::]")

    def bind_address(self, address: str) -> str:
        """Where a socket configured with `address` binds: a wildcard tcp host becomes loopback
        unless `expose` (the feed carries every tenant's token ids)."""
        if self.expose or not address.startswith("tcp://"):
            return address
        head, _, port = address.removeprefix("tcp://").rpartition(":")
        if head in ("*", "0.0.0.0"):
            return f"tcp://127.0.0.1:{port}"
        if head in ("::", "[::]"):
            return f"tcp://[::1]:{port}"
        return address

    def exposed(self, address: str) -> bool:
        """Whether binding `address` opens the feed beyond this machine."""
        if not address.startswith("tcp://"):
            return False
        host = self.bind_address(address).removeprefix("tcp://").rpartition(":")[0]
        return host not in ("127.0.0.1", "localhost", "[::1]", "::1")

    def for_rank(self, rank: int, step: int = 1) -> KVEventsConfig:
        """The config of data-parallel worker `rank`: tcp ports moved up by `rank * step`, ipc
        paths suffixed, so every worker's KV cache publishes on its own sockets (`step` 2 keeps
        the usual replay = endpoint + 1 pairs apart)."""
        def shift(address: str | None) -> str | None:
            if address is None or rank == 0:
                return address
            if address.startswith("tcp://"):
                head, _, port = address.rpartition(":")
                return f"{head}:{int(port) + rank * step}" if port.isdigit() else address
            return f"{address}_dp{rank}"

        return replace(self, endpoint=shift(self.endpoint), replay_endpoint=shift(self.replay_endpoint))

    def to_json(self) -> str:
        """This config as a `--kv-events-config` value (what `parse` reads back)."""
        return json.dumps({f.name: getattr(self, f.name) for f in fields(self)})

    @classmethod
    def parse(cls, text: str | None) -> KVEventsConfig:
        """The config a `--kv-events-config` value asks for (None or "": off). Raises
        `ConfigError` naming the key at fault, or the unknown keys."""
        if text is None or not str(text).strip():
            return cls()
        try:
            raw = json.loads(text)
        except json.JSONDecodeError as e:
            raise ConfigError(f"kv_events_config is not valid JSON ({e}); e.g. "
                              '\'{"publisher": "zmq", "endpoint": "tcp://*:5557"}\'') from None
        if not isinstance(raw, dict):
            raise ConfigError(f"kv_events_config must be a JSON object, got {type(raw).__name__}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(raw) - known - set(KV_EVENTS_IGNORED_KEYS) - {"enable_kv_cache_events"})
        if unknown:
            raise ConfigError(f"kv_events_config: unknown key(s) {unknown}; radixkv reads {sorted(known)} and "
                              f"accepts {sorted([*KV_EVENTS_IGNORED_KEYS, 'enable_kv_cache_events'])}")
        enable = raw.pop("enable_kv_cache_events", None)
        if enable is not None and not isinstance(enable, bool):
            raise ConfigError(f"kv_events_config: enable_kv_cache_events={enable!r}: must be true or false")
        if enable is False and raw.get("publisher") == "zmq":
            raise ConfigError("kv_events_config: enable_kv_cache_events=false contradicts publisher='zmq'")
        queue_size = raw.pop("max_queue_size", None)
        if queue_size is not None and (not isinstance(queue_size, int) or isinstance(queue_size, bool)
                                       or queue_size < 1):
            raise ConfigError(f"kv_events_config: max_queue_size={queue_size!r}: must be an integer >= 1")
        fmt = raw.pop("format", None)
        if fmt not in (None, "default", "dynamo"):
            raise ConfigError(f"kv_events_config: format={fmt!r}: must be 'default' or 'dynamo'")
        raw.setdefault("publisher", "zmq" if enable else "null")
        return cls(**raw)
