"""RouterConfig: the `radixkv router` options (which workers, how to route, where to listen).
Its CLI flags are generated from these fields, as `serve`'s are from ServerConfig's."""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urlparse

from radixkv.config.fields import LOG_LEVELS, opt
from radixkv.errors import ConfigError

ROUTING_POLICIES = ("cache_aware", "round_robin", "least_load")


def worker_url(url: str, flag: str = "--worker") -> str:
    """A worker's base URL, without a trailing slash; ConfigError naming `flag` if it is not one."""
    parsed = urlparse(url)
    if parsed.scheme not in ("http", "https") or not parsed.netloc:
        raise ConfigError(f"{flag} {url!r}: give a base URL such as http://127.0.0.1:30001")
    return url.rstrip("/")


@dataclass(frozen=True)
class RouterConfig:
    """How `radixkv router` fronts its workers. Checks name the flag at fault."""

    worker: tuple[str, ...] | None = opt(None, "a worker's base URL, e.g. http://127.0.0.1:30001 (repeat for each "
                                         "worker; with --pd-disaggregation give --prefill and --decode instead)",
                                         action="append", metavar="URL", default_in_help=True)
    pd_disaggregation: bool = opt(False, "prefill/decode disaggregation (SGLang's router flag): each request goes "
                                  "to a --prefill server and a --decode server with bootstrap_host, bootstrap_port "
                                  "and bootstrap_room added; the decode server's answer is the client's")
    prefill: tuple | None = opt(None, "a prefill server's base URL and, optionally, its bootstrap port "
                                "(--disaggregation-bootstrap-port; 'none' or omitted: the decode server's "
                                "default), e.g. --prefill http://127.0.0.1:30001 8998 (repeat for each)",
                                action="append", nargs="+", metavar="URL_AND_PORT", default_in_help=True)
    decode: tuple[str, ...] | None = opt(None, "a decode server's base URL (repeat for each)", action="append",
                                         metavar="URL", default_in_help=True)
    policy: str = opt("cache_aware", "routing policy (default: %(default)s)", choices=ROUTING_POLICIES,
                      default_in_help=True)
    host: str = opt("127.0.0.1", "address to listen on (default: %(default)s)", default_in_help=True)
    port: int = opt(30000, "port to listen on (default: %(default)s)", default_in_help=True)
    api_key: str | None = opt(None, "required from clients as 'Authorization: Bearer KEY' (except /health) "
                              "and sent to the workers (default: none)", default_in_help=True, metavar="KEY")
    health_interval: float = opt(2.0, "seconds between health checks of every worker (default: %(default)s)",
                                 default_in_help=True, metavar="SECONDS")
    log_level: str = opt("info", "log verbosity (default: %(default)s)", choices=LOG_LEVELS, default_in_help=True)

    def __post_init__(self) -> None:
        if self.pd_disaggregation:
            if self.worker:
                raise ConfigError("--worker: with --pd-disaggregation give --prefill and --decode instead")
            if not self.prefill or not self.decode:
                raise ConfigError("--pd-disaggregation: give at least one --prefill URL and one --decode URL")
            urls = [url for url, _ in self.prefill_servers] + list(self.decode_servers)
            if len(set(urls)) != len(urls):
                raise ConfigError("--prefill/--decode: the same URL is given twice")
        else:
            if self.prefill or self.decode:
                raise ConfigError("--prefill/--decode: need --pd-disaggregation")
            if not self.worker:
                raise ConfigError("--worker: give at least one worker URL")
            if len(set(self.workers)) != len(self.workers):
                raise ConfigError("--worker: the same URL is given twice")
        if self.policy not in ROUTING_POLICIES:
            raise ConfigError(f"--policy {self.policy}: must be one of {list(ROUTING_POLICIES)}")
        if not (isinstance(self.port, int) and 0 < self.port < 65536):
            raise ConfigError(f"--port {self.port}: must be in 1..65535")
        if not self.health_interval > 0:
            raise ConfigError(f"--health-interval {self.health_interval}: must be > 0")
        if self.api_key is not None and not self.api_key:
            raise ConfigError("--api-key: a key must not be empty")
        if self.log_level not in LOG_LEVELS:
            raise ConfigError(f"--log-level {self.log_level}: must be one of {list(LOG_LEVELS)}")

    @property
    def prefill_servers(self) -> tuple[tuple[str, int | None], ...]:
        """(base URL, bootstrap port or None) of each --prefill."""
        out = []
        for given in self.prefill or ():
            given = [given] if isinstance(given, str) else list(given)
            if not 1 <= len(given) <= 2:
                raise ConfigError(f"--prefill {' '.join(map(str, given))}: give a URL and optionally a bootstrap port")
            port = given[1] if len(given) == 2 else None
            if isinstance(port, str):
                if port.lower() == "none":
                    port = None
                elif port.isdigit() and 0 < int(port) < 65536:
                    port = int(port)
                else:
                    raise ConfigError(f"--prefill {given[0]} {port}: the bootstrap port must be in 1..65535 or 'none'")
            out.append((worker_url(given[0], "--prefill"), port))
        return tuple(out)

    @property
    def decode_servers(self) -> tuple[str, ...]:
        return tuple(worker_url(url, "--decode") for url in self.decode or ())

    @property
    def workers(self) -> tuple[str, ...]:
        """The workers' base URLs, without trailing slashes."""
        return tuple(worker_url(url) for url in self.worker or ())
