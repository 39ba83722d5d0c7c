"""What the scheduler served, as a Mooncake-format trace (`record_trace`): no text, no token ids.

One JSON object a line, in arrival order, as the Mooncake release has them:

    {"timestamp": ms since the first request, "input_length": prompt tokens,
     "output_length": tokens generated, "hash_ids": [one id per `block_size` prompt tokens]}

Each id names its block's whole prefix: a keyed BLAKE2b chain over the namespace and the
blocks' token ids (the last, partial block included), truncated to 63 bits. The key is drawn
afresh for each recording, so ids say which prompts share which prefixes and nothing about their
tokens, and two recordings' ids do not meet. `radixkv plan` and `radixkv.workloads.replay` read
it back (`block_size` is in every line, for a reader that needs it).

A line is written once its request finished and every request that arrived before it did too
(so the file stays in arrival order); `close` writes the rest with what they had generated.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

from radixkv.errors import ConfigError
from radixkv.sched.request import Req

_MASK = (1 << 63) - 1


class TraceRecorder:
    """Writes the requests the scheduler served to `path` (overwritten), one line each."""

    def __init__(self, path: str | Path, block_size: int):
        self.path = Path(path)
        self.block_size = block_size
        self._key = os.urandom(32)
        self._file: IO[str] | None = self.path.open("w", buffering=1)
        self._start: float | None = None
        self._pending: OrderedDict[str, dict[str, Any] | None] = OrderedDict()  # rid -> its line, once finished
        self._reqs: dict[str, Req] = {}
        self.written = 0

    def hash_ids(self, ids: Sequence[int], namespace: Any) -> list[int]:
        """The prefix-block ids of a prompt (see the module docstring)."""
        prev = hashlib.blake2b(repr(namespace).encode(), key=self._key, digest_size=16).digest()
        out = []
        for start in range(0, len(ids), self.block_size):
            block = b"".join(int(t).to_bytes(4, "little", signed=True) for t in ids[start:start + self.block_size])
            prev = hashlib.blake2b(prev + block, key=self._key, digest_size=16).digest()
            out.append(int.from_bytes(prev[:8], "little") & _MASK)
        return out

    def arrived(self, req: Req) -> None:
        if self._start is None:
            self._start = req.arrival_time
        self._pending[req.rid] = None
        self._reqs[req.rid] = req

    def finished(self, req: Req) -> None:
        if req.rid not in self._pending:
            return
        self._pending[req.rid] = self._line(req)
        del self._reqs[req.rid]
        while self._pending and next(iter(self._pending.values())) is not None:
            self._write(self._pending.popitem(last=False)[1])

    def _line(self, req: Req) -> dict[str, Any]:
        ms = (req.arrival_time - (self._start or req.arrival_time)) * 1000
        return {"timestamp": round(ms, 3), "input_length": len(req.prompt_ids), "output_length": len(req.output_ids),
                "hash_ids": self.hash_ids(req.prompt_ids, req.namespace), "block_size": self.block_size}

    def _write(self, line: dict[str, Any]) -> None:
        if self._file is not None:
            self._file.write(json.dumps(line, separators=(",", ":")) + "\n")
            self.written += 1

    def close(self) -> None:
        """Write the requests still pending (with what they generated so far) and close."""
        for rid, line in self._pending.items():
            self._write(line if line is not None else self._line(self._reqs[rid]))
        self._pending.clear()
        self._reqs.clear()
        if self._file is not None:
            self._file.close()
            self._file = None


def open_recorder(path: str | None, block_size: int) -> TraceRecorder | None:
    """The recorder `record_trace` names, or None when off; a path that cannot be written is a
    `ConfigError` naming the option."""
    if path is None:
        return None
    try:
        return TraceRecorder(path, block_size)
    except OSError as e:
        raise ConfigError(f"record_trace={path!r}: cannot write it: {e.strerror or e}") from e
