"""What the scheduler served, as a Mooncake-format trace (`record_trace`): no text, no token ids.

One JSON object a line, in arrival order, as the Mooncake release has them:

    {"timestamp": ms since the first request, "input_length": prompt tokens,
     "output_length": tokens generated, "hash_ids": [one id per `block_size` prompt tokens]}

and, for a request run under a LoRA adapter, `"adapter"`: its name (its id once unloaded), so
`radixkv plan` reports each adapter's hit rate (each adapter's cache is its own).

Each id names its block's whole prefix: the block hash (`radixkv.mem.block_hash`) over the
namespace and the blocks' token ids (the last, partial block included), as its 63-bit
`block_id`: at the server's page size, the id its KV events announce for that page and the
key its storage tier holds it under. No text or token id is written, but the ids are not
secret: whoever can guess a prompt's tokens can confirm it (share a trace as you would the
KV events). `radixkv plan` and `radixkv.workloads.replay` read
it back (`block_size` is in every line, for a reader that needs it).

A line is written once its request finished and every request that arrived before it did too
(so the file stays in arrival order); `close` writes the rest with what they had generated.
"""

from __future__ import annotations

import itertools
import json
from collections import OrderedDict
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO, Any

from radixkv.errors import ConfigError
from radixkv.mem.block_hash import block_ids
from radixkv.sched.request import Req

class TraceRecorder:
    """Writes the requests the scheduler served to `path` (overwritten), one line each."""

    def __init__(self, path: str | Path, block_size: int,
                 adapter_name: Callable[[str], str] | None = None):
        self.path = Path(path)
        self.block_size = block_size
        self.adapter_name = adapter_name or (lambda aid: aid)  # LoRA adapter id -> its name
        self._file: IO[str] | None = self.path.open("w", buffering=1)
        self._start: float | None = None
        # In arrival order, by a sequence number of our own (a rid may be used again once its
        # request finished, and so may the id() of a request object that is gone): its line, once
        # finished. `_live` finds a running request's number (its object is held, in `_reqs`,
        # until it finishes, so its id() is its own meanwhile).
        self._pending: OrderedDict[int, dict[str, Any] | None] = OrderedDict()
        self._reqs: dict[int, Req] = {}
        self._live: dict[int, int] = {}  # id(req) -> its number
        self._numbers = itertools.count()
        self.written = 0

    def hash_ids(self, ids: Sequence[int], namespace: Any) -> list[int]:
        """The prefix-block ids of a prompt (see the module docstring)."""
        return block_ids(namespace, ids, self.block_size, partial=True)

    def arrived(self, req: Req) -> None:
        if self._start is None:
            self._start = req.arrival_time
        number = next(self._numbers)
        self._pending[number] = None
        self._reqs[number] = req
        self._live[id(req)] = number

    def finished(self, req: Req) -> None:
        number = self._live.get(id(req))
        if number is None or self._reqs[number] is not req:
            return
        del self._live[id(req)], self._reqs[number]
        self._pending[number] = self._line(req)
        while self._pending and next(iter(self._pending.values())) is not None:
            self._write(self._pending.popitem(last=False)[1])

    def _line(self, req: Req) -> dict[str, Any]:
        ms = (req.arrival_time - (self._start or req.arrival_time)) * 1000
        line = {"timestamp": round(ms, 3), "input_length": len(req.prompt_ids), "output_length": len(req.output_ids),
                "hash_ids": self.hash_ids(req.prompt_ids, req.namespace), "block_size": self.block_size}
        if req.lora is not None:
            line["adapter"] = self.adapter_name(req.lora)
        return line

    def _write(self, line: dict[str, Any]) -> None:
        if self._file is not None:
            self._file.write(json.dumps(line, separators=(",", ":")) + "\n")
            self.written += 1

    def close(self) -> None:
        """Write the requests still pending (with what they generated so far) and close."""
        for key, line in self._pending.items():
            self._write(line if line is not None else self._line(self._reqs[key]))
        self._pending.clear()
        self._reqs.clear()
        self._live.clear()
        if self._file is not None:
            self._file.close()
            self._file = None


def open_recorder(path: str | None, block_size: int,
                  adapter_name: Callable[[str], str] | None = None) -> TraceRecorder | None:
    """The recorder `record_trace` names, or None when off; a path that cannot be written is a
    `ConfigError` naming the option."""
    if path is None:
        return None
    try:
        return TraceRecorder(path, block_size, adapter_name)
    except OSError as e:
        raise ConfigError(f"record_trace={path!r}: cannot write it: {e.strerror or e}") from e
