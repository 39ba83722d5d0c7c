"""A per-request and per-step timeline of the scheduler, as JSON lines (`timeline_file`).

Answers "where did this request's time to first token go": each finished request writes when it
reached the scheduler, when it was first scheduled into a forward, when its first token was
sampled and when it finished; each forward writes when it started, how long the forward and the
whole step took, and what it ran (decode rows, prefill tokens, which requests). Times are
seconds on the scheduler's clock (`time.perf_counter`), so requests and steps line up.

    radixkv serve --timeline-file /tmp/timeline.jsonl
    python -c "import json; print([json.loads(l) for l in open('/tmp/timeline.jsonl')][:3])"
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import IO

from radixkv.errors import ConfigError
from radixkv.sched.request import Req


class Timeline:
    """Appends one JSON object per line to `path` (line-buffered: readable while it runs)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self._file: IO[str] | None = self.path.open("a", buffering=1)

    def step(self, start: float, forward: float, seconds: float, num_decode: int, prefill_tokens: int,
             rids: list[str]) -> None:
        self._write({"event": "step", "start": start, "forward_s": forward, "step_s": seconds,
                     "decode_rows": num_decode, "prefill_tokens": prefill_tokens, "rids": rids})

    def finished(self, req: Req) -> None:
        self._write({"event": "request", "rid": req.rid, "arrival": req.arrival_time, "admitted": req.admit_time,
                     "first_token": req.first_token_time, "finished": req.finish_time,
                     "prompt_tokens": len(req.prompt_ids), "cached_tokens": req.cached_tokens,
                     "output_tokens": len(req.output_ids), "retractions": req.retractions,
                     "finish_reason": (req.finish_reason or {}).get("type")})

    def _write(self, record: dict) -> None:
        if self._file is not None:
            self._file.write(json.dumps(record) + "\n")

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


def open_timeline(path: str | None) -> Timeline | None:
    """The timeline `timeline_file` names, or None when it is off; a path that cannot be written
    is a `ConfigError` naming the option."""
    if path is None:
        return None
    try:
        return Timeline(path)
    except OSError as e:
        raise ConfigError(f"timeline_file={path!r}: cannot write it: {e.strerror or e}") from e
