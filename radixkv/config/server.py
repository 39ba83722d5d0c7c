"""ServerConfig: the `radixkv serve` options that are not the engine's (where to listen, who may
call, how long to drain, data parallelism). Its CLI flags are generated from these fields, as the
engine's are from EngineConfig's."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from radixkv.config.fields import opt
from radixkv.errors import ConfigError
from radixkv.kv_bytes import parse_size
from radixkv.tenancy import SHARING

ROUTERS = ("embedded", "sglang")
MAX_DP = 16
"""The most data-parallel workers one `serve --dp N` starts."""


def _flag(default: Any, help: str, **flag: Any) -> Any:
    """An option whose help text says its default itself."""
    return opt(default, help, default_in_help=True, **flag)


@dataclass(frozen=True)
class ServerConfig:
    """How `radixkv serve` serves an engine over HTTP. Checks name the flag at fault."""

    host: str = _flag("127.0.0.1", "address to listen on (default: %(default)s; 0.0.0.0 for every interface)")
    port: int = _flag(30000, "port to listen on (default: %(default)s)")
    api_key: tuple[str, ...] | None = _flag(
        None, "require 'Authorization: Bearer KEY' on every endpoint but /health; repeat it for several "
              "clients, each its own principal: its own cache namespace (no key hits or sees another's cached "
              "prefixes, unless --cache-sharing all), its own request ids and stored responses "
              "(default: no key)", action="append", metavar="KEY")
    admin_key: str | None = _flag(
        None, "a key that may also POST /flush_cache and see every tenant's nodes in /cache_tree and "
              "/dashboard; it serves requests as a principal of its own. With several --api-key and no "
              "--admin-key, no key may flush; with one key or none, that key (or anyone) may "
              "(default: none)", metavar="KEY")
    cache_sharing: str = _flag(
        "per-key", "with several --api-key: per-key gives each key its own prefix cache (a repeat of "
                   "another key's prompt computes every token); all shares one cache between every key "
                   "(more hits, but a key can tell from timing or cached_tokens what another key sent) "
                   "(default: %(default)s)", choices=SHARING)
    shutdown_timeout: float = _flag(
        30.0, "on SIGTERM, stop taking requests and give those in flight this long to finish; then each "
              "left ends with an error (a stream with an error event and [DONE]) and the server exits. "
              "Ctrl-C ends them at once (default: %(default)s)", metavar="SECONDS")
    served_model_name: str | None = _flag(None, "the model's name in /v1/models and in OpenAI requests "
                                        "(default: SmolLM2-135M-Instruct, or the model directory's name)")
    max_body_bytes: int | None = _flag(None, "largest request body accepted; larger ones get HTTP 413 "
                                     "(default: 8 MiB)")
    responses_store_size: int = _flag(
        1024, "Responses API: keep at most N responses (per server, each visible only to the API key that "
              "made it) for previous_response_id and GET /v1/responses/{id}; the oldest go first; 0 keeps "
              "none (default: %(default)s)", metavar="N")
    responses_store_ttl: float = _flag(3600.0, "Responses API: forget a stored response this long after it "
                                     "was made (default: %(default)s)", metavar="SECONDS")
    responses_store_memory: str = _flag(
        "256MiB", "Responses API: the stored responses take at most this much memory of the HTTP process "
                  "(their JSON, conversations and token ids, estimated); the oldest go first (default: %(default)s)",
        metavar="SIZE")
    max_queued_requests: int = _flag(
        4096, "the most requests this server holds at once (each prompt of a batch and each sample of n "
              "counts); a body that needs more is refused whole with HTTP 400, one that does not fit beside "
              "those in flight with HTTP 429 (default: %(default)s)", metavar="N")
    reasoning_parser: str | None = _flag(
        None, "split a thinking model's output into reasoning and answer (SGLang's names): qwen3, glm45, "
              "deepseek-v3 (the answer may open with <think>...</think>), qwen3-thinking, deepseek-r1 (the "
              "prompt opens it); the chat API returns it as reasoning_content, the Responses API as a "
              "reasoning item, the Messages API as a thinking block (default: none)",
        choices=["qwen3", "glm45", "deepseek-v3", "qwen3-thinking", "deepseek-r1"])
    tool_call_parser: str | None = _flag(
        None, "the format a model writes tool calls in, parsed into tool_calls: hermes, qwen25, qwen3 "
              "(<tool_call>{...}</tool_call>), mistral ([TOOL_CALLS] [...]), llama3 ({\"name\": ..., "
              "\"parameters\": ...}) (default: hermes, the format tool_choice=required generates)",
        choices=["hermes", "qwen25", "qwen3", "mistral", "llama3"])
    dp: int = _flag(1, "data parallelism: start this many workers (on ports PORT+1 .. PORT+N, each with these "
                  "engine flags) behind a cache-aware router on PORT (default: 1, no router)")
    dp_max_restarts: int = _flag(3, "with --dp N, start a worker that failed (killed, or its scheduler died) "
                                 "again at most this many times; once every worker has exited, the command "
                                 "exits 1 (default: %(default)s)", metavar="N")
    router: str = _flag("embedded", "with --dp N, the router in front of the workers: embedded (radixkv's own, "
                      "cache-aware, no extra dependency) or sglang (SGLang's Rust router, "
                      "`pip install 'radixkv[router]'`, policy cache_aware; the embedded one is used, with a "
                      "warning, when it is not installed) (default: %(default)s)", choices=ROUTERS)

    def __post_init__(self) -> None:
        def check(ok: bool, why: str) -> None:
            if not ok:
                raise ConfigError(why)

        check(isinstance(self.port, int) and 0 < self.port < 65536, f"--port {self.port}: must be in 1..65535")
        check(self.api_key is None or all(isinstance(key, str) and key for key in self.api_key),
              "--api-key: a key must not be empty")
        check(self.admin_key is None or (isinstance(self.admin_key, str) and self.admin_key != ""),
              "--admin-key: must not be empty")
        check(self.admin_key is None or bool(self.api_keys), "--admin-key needs --api-key (keys for the tenants)")
        check(self.admin_key is None or self.admin_key not in self.api_keys,
              "--admin-key: must differ from every --api-key")
        check(self.cache_sharing in SHARING, f"--cache-sharing {self.cache_sharing}: must be one of {list(SHARING)}")
        check(0 <= self.shutdown_timeout <= 24 * 3600,
              f"--shutdown-timeout {self.shutdown_timeout}: must be in [0, 86400] seconds")
        check(self.max_body_bytes is None or self.max_body_bytes >= 1024,
              f"--max-body-bytes {self.max_body_bytes}: must be at least 1024")
        check(self.responses_store_size >= 0,
              f"--responses-store-size={self.responses_store_size}: must be >= 0 (0 stores nothing)")
        check(self.responses_store_ttl > 0, f"--responses-store-ttl={self.responses_store_ttl}: must be > 0 seconds")
        try:
            self.responses_store_bytes
        except ConfigError:
            raise ConfigError(f"--responses-store-memory={self.responses_store_memory!r}: give bytes with a unit "
                              f"(e.g. 256MiB, 1GB)") from None
        check(isinstance(self.max_queued_requests, int) and 1 <= self.max_queued_requests <= 1 << 20,
              f"--max-queued-requests {self.max_queued_requests}: must be in 1..{1 << 20}")
        check(isinstance(self.dp, int) and 1 <= self.dp <= MAX_DP, f"--dp {self.dp}: must be in 1..{MAX_DP}")
        check(self.dp == 1 or len(self.api_keys) <= 1, "--dp takes one --api-key (the router's clients share it)")
        check(self.dp == 1 or self.admin_key is None, "--admin-key: not with --dp (the router's clients share one key)")
        check(self.dp == 1 or self.port + self.dp < 65536,
              f"--port {self.port}: PORT..PORT+{self.dp} must be valid ports")
        check(self.router in ROUTERS, f"--router {self.router}: must be one of {list(ROUTERS)}")
        check(isinstance(self.dp_max_restarts, int) and 0 <= self.dp_max_restarts <= 1000,
              f"--dp-max-restarts {self.dp_max_restarts}: must be in 0..1000")
        check(self.router == "embedded" or self.dp > 1,
              "--router chooses the router in front of --dp N workers; give --dp 2 or more")

    @property
    def responses_store_bytes(self) -> int:
        return parse_size(str(self.responses_store_memory))

    @property
    def api_keys(self) -> tuple[str, ...]:
        """The keys clients may present (none: no key is asked for)."""
        return tuple(self.api_key or ())
