"""DisaggConfig: prefill/decode disaggregation (SGLang's `--disaggregation-*` flags).

A prefill server computes prompts and sends their KV pages to decode servers, which run the
decode; a router (SGLang's `--pd-disaggregation`, or `radixkv router --pd-disaggregation`)
sends each request to one of each with `bootstrap_host`, `bootstrap_port` and `bootstrap_room`
added. The pages travel with the Mooncake transfer engine (`radixkv.disagg`).
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass

from radixkv.config.fields import is_int, opt, require
from radixkv.errors import ConfigError

DISAGGREGATION_MODES = ("null", "prefill", "decode")
TRANSFER_BACKENDS = ("mooncake",)
INSTALL_HINT = "pip install 'radixkv[mooncake]' (and apt-get install libibverbs1 on Debian/Ubuntu)"


@dataclass(frozen=True)
class DisaggConfig:
    """Which side of a prefill/decode pair this server is, and how its pages travel."""

    disaggregation_mode: str = opt("null", "prefill/decode disaggregation: null (a whole server), prefill "
                                   "(computes prompts, sends their KV to a decode server) or decode (receives "
                                   "a prompt's KV, runs the decode); requests without bootstrap_room are "
                                   "served whole on either", choices=list(DISAGGREGATION_MODES))
    disaggregation_transfer_backend: str = opt("mooncake", "what moves KV pages between prefill and decode "
                                               "servers: mooncake (the Mooncake transfer engine)",
                                               choices=list(TRANSFER_BACKENDS))
    disaggregation_bootstrap_port: int = opt(8998, "prefill: the port its bootstrap server listens on (give "
                                             "it to the router after the prefill URL); decode: the port a "
                                             "request without bootstrap_port reaches its prefill server on")
    disaggregation_ib_device: str | None = opt(None, "the RDMA device(s) the transfer engine uses (e.g. "
                                               "mlx5_0); unset: TCP")
    disaggregation_host: str = opt("127.0.0.1", "the address this server's bootstrap server binds (prefill) "
                                   "and its transfer engine announces to its peers: give the machine's "
                                   "address on the network prefill and decode servers share")
    disaggregation_transfer_timeout: float = opt(30.0, "seconds one side of a transfer waits for the other "
                                                 "(a decode server for its prefill server's pages, a prefill "
                                                 "server for its decode server); then the request ends with "
                                                 "an error and its pages are freed")

    def __post_init__(self) -> None:
        def check(ok: bool, name: str, why: str) -> None:
            require(self, ok, name, why)

        check(self.disaggregation_mode in DISAGGREGATION_MODES, "disaggregation_mode",
              f"must be one of {list(DISAGGREGATION_MODES)}")
        check(self.disaggregation_transfer_backend in TRANSFER_BACKENDS, "disaggregation_transfer_backend",
              f"must be one of {list(TRANSFER_BACKENDS)}")
        check(is_int(self.disaggregation_bootstrap_port) and 1 <= self.disaggregation_bootstrap_port <= 65535,
              "disaggregation_bootstrap_port", "must be a port number in [1, 65535]")
        check(isinstance(self.disaggregation_host, str) and bool(self.disaggregation_host.strip()),
              "disaggregation_host", "must be a host name or address")
        check(isinstance(self.disaggregation_transfer_timeout, (int, float))
              and not isinstance(self.disaggregation_transfer_timeout, bool)
              and 0 < self.disaggregation_transfer_timeout <= 3600, "disaggregation_transfer_timeout",
              "must be a number of seconds in (0, 3600]")
        if self.enabled and importlib.util.find_spec("mooncake") is None:
            raise ConfigError(f"disaggregation_mode={self.disaggregation_mode!r}: the Mooncake transfer engine "
                              f"is not installed: {INSTALL_HINT}")

    @property
    def enabled(self) -> bool:
        return self.disaggregation_mode != "null"
