"""RouterConfig: the `radixkv router` options (which workers, how to route, where to listen).
Its CLI flags are generated from these fields, as `serve`'s are from ServerConfig's."""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urlparse

from radixkv.config.fields import LOG_LEVELS, opt
from radixkv.errors import ConfigError

ROUTING_POLICIES = ("cache_aware", "round_robin", "least_load")


def worker_url(url: str) -> str:
    """A worker's base URL, without a trailing slash; ConfigError naming --worker if it is not one."""
    parsed = urlparse(url)
    if parsed.scheme not in ("http", "https") or not parsed.netloc:
        raise ConfigError(f"--worker {url!r}: give a base URL such as http://127.0.0.1:30001")
    return url.rstrip("/")


@dataclass(frozen=True)
class RouterConfig:
    """How `radixkv router` fronts its workers. Checks name the flag at fault."""

    worker: tuple[str, ...] | None = opt(None, "a worker's base URL, e.g. http://127.0.0.1:30001 (repeat for each worker)",
                                  action="append", metavar="URL", required=True, default_in_help=True)
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
    def workers(self) -> tuple[str, ...]:
        """The workers' base URLs, without trailing slashes."""
        return tuple(worker_url(url) for url in self.worker or ())
