"""Where a request's prefill runs: the router's `bootstrap_host`, `bootstrap_port`, `bootstrap_room`.

SGLang's PD router adds the three to every request it sends to a prefill and a decode server
(lists for a batch): the prefill server's host, its bootstrap port (None when the router was
not given one: the decode server then uses its own `--disaggregation-bootstrap-port`), and a
random 63-bit room naming the pair's transfer. Imported by the HTTP process: no torch here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from radixkv.errors import InvalidRequestError

ROOM_MAX = (1 << 63) - 1
HOST_MAX_CHARS = 255


@dataclass(frozen=True, slots=True)
class Bootstrap:
    """A request's prefill server (`host`, `port`: its bootstrap server) and its `room`."""

    host: str
    port: int | None
    room: int

    def address(self, default_port: int) -> str:
        host = self.host if ":" not in self.host or self.host.startswith("[") else f"[{self.host}]"
        return f"tcp://{host}:{self.port if self.port is not None else default_port}"


def _one(host: Any, port: Any, room: Any, where: str) -> Bootstrap | None:
    if host is None and port is None and room is None:
        return None
    if room is None:
        raise InvalidRequestError(f"bootstrap_room{where}: needed with bootstrap_host / bootstrap_port")
    if not isinstance(room, int) or isinstance(room, bool) or not 0 <= room <= ROOM_MAX:
        raise InvalidRequestError(f"bootstrap_room{where}={room!r}: must be an integer in [0, 2**63 - 1]")
    if not isinstance(host, str) or not host.strip() or len(host) > HOST_MAX_CHARS or any(c in host for c in "/ \t\n"):
        raise InvalidRequestError(f"bootstrap_host{where}={host!r}: must be the prefill server's host name or address")
    if port is not None and (not isinstance(port, int) or isinstance(port, bool) or not 1 <= port <= 65535):
        raise InvalidRequestError(f"bootstrap_port{where}={port!r}: must be a port number in [1, 65535] or null")
    return Bootstrap(host.strip("[]") if host.startswith("[") else host, port, room)


def bootstraps(host: Any, port: Any, room: Any, n: int) -> list[Bootstrap | None]:
    """Each of `n` prompts' `Bootstrap` (None: served whole here), from a body's three fields,
    each one value or (for a batch) a list of `n`; raises `InvalidRequestError` naming the field."""
    values = {"bootstrap_host": host, "bootstrap_port": port, "bootstrap_room": room}
    lists = {name: v for name, v in values.items() if isinstance(v, list)}
    for name, v in lists.items():
        if len(v) != n:
            raise InvalidRequestError(f"{name}: a list of {len(v)} for {n} prompt(s)")
    if not lists:
        one = _one(host, port, room, "")
        if one is not None and n != 1:
            raise InvalidRequestError(f"bootstrap_room={room!r}: one room for {n} prompts; give a list, one per prompt")
        return [one] * n
    column = {name: v if isinstance(v, list) else [v] * n for name, v in values.items()}
    out = [_one(column["bootstrap_host"][i], column["bootstrap_port"][i], column["bootstrap_room"][i], f"[{i}]")
           for i in range(n)]
    rooms = [b.room for b in out if b is not None]
    if len(set(rooms)) != len(rooms):
        raise InvalidRequestError("bootstrap_room: each prompt of a batch needs its own room")
    return out
