"""Retention hints: how long a client asks the cache to keep a request's prefixes.

The hosted APIs let a client say how long a prefix should stay cached: Anthropic's
`cache_control: {"type": "ephemeral", "ttl": "5m" | "1h"}` on a content block (the prompt up to
that block), OpenAI's `prompt_cache_retention` ("in_memory" | "24h") and `prompt_cache_key`
(the whole conversation). Here those hints reach eviction: a node of the radix tree covered by
a span gets a retention deadline, and the eviction policy takes retained leaves only when no
other leaf is left (`radixkv.mem.radix_cache`). They stay evictable, so a hint never blocks
admission.

A `Retention` is a list of spans `(tokens, seconds)`: the first `tokens` tokens of the request's
sequence (`WHOLE`: all of it, prompt and output) are kept `seconds` from when they are cached.
The server caps `seconds` at `--max-cache-retention`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from radixkv.errors import InvalidRequestError

WHOLE = -1
"""A span's `tokens` for the request's whole sequence (prompt and output, as cached)."""

TTL_SECONDS = {"5m": 300.0, "1h": 3600.0, "30m": 1800.0, "12h": 43200.0, "24h": 86400.0, "in_memory": 300.0}
"""The hosted APIs' retention names, in seconds (Anthropic's `ttl`; OpenAI's
`prompt_cache_retention`, whose "in_memory" prefixes it keeps 5-10 minutes, and its
`prompt_cache_options.ttl` / `prompt_cache_breakpoint.ttl`)."""

CONVERSATION_SECONDS = TTL_SECONDS["in_memory"]
"""What a `prompt_cache_key` conversation is kept when no retention is named."""

MAX_SPANS = 8


@dataclass(frozen=True, slots=True)
class Retention:
    """Spans of a request's sequence to keep: each `(tokens, seconds)` (see the module docstring)."""

    spans: tuple[tuple[int, float], ...] = ()

    def __post_init__(self) -> None:
        if len(self.spans) > MAX_SPANS:
            raise InvalidRequestError(f"at most {MAX_SPANS} retention spans (cache breakpoints), got {len(self.spans)}")
        for tokens, seconds in self.spans:
            if not isinstance(tokens, int) or isinstance(tokens, bool) or (tokens < 0 and tokens != WHOLE):
                raise InvalidRequestError(f"retention span of {tokens!r} tokens: must be >= 0 or WHOLE (-1)")
            if not isinstance(seconds, (int, float)) or isinstance(seconds, bool) or not math.isfinite(seconds) \
                    or seconds < 0:
                raise InvalidRequestError(f"retention of {seconds!r} seconds: must be a finite number >= 0")

    @classmethod
    def whole(cls, seconds: float) -> Retention:
        """Keep the whole sequence `seconds`."""
        return cls(((WHOLE, float(seconds)),))

    @classmethod
    def named(cls, ttl: str, where: str) -> float:
        """Seconds of a named retention (`5m`, `1h`, `24h`, `in_memory`); 400 naming `where`."""
        try:
            return TTL_SECONDS[ttl]
        except (KeyError, TypeError):
            raise InvalidRequestError(f"{where}={ttl!r}: must be one of {sorted(TTL_SECONDS)}") from None

    def __bool__(self) -> bool:
        return any(seconds > 0 for _, seconds in self.spans)

    def capped(self, max_seconds: float) -> Retention:
        """Every span kept at most `max_seconds` (0: hints are ignored, nothing is retained)."""
        return Retention(tuple((t, min(s, max_seconds)) for t, s in self.spans if min(s, max_seconds) > 0))

    def seconds_at(self, position: int, sequence_len: int) -> float:
        """How long the token at `position` of a sequence of `sequence_len` tokens is kept
        (the longest span covering it; 0: not retained)."""
        return max((s for t, s in self.spans if position < (sequence_len if t == WHOLE else t)), default=0.0)

    def ends(self, sequence_len: int) -> list[tuple[int, float]]:
        """Each span of more than 0 seconds as `(tokens it covers, seconds)` in a sequence of
        `sequence_len` tokens: WHOLE resolved to the sequence, every end clipped to it."""
        return [(sequence_len if t == WHOLE else min(t, sequence_len), s) for t, s in self.spans if s > 0]

    def to_row(self) -> list:
        return [[t, s] for t, s in self.spans]

    @classmethod
    def from_row(cls, row: list) -> Retention:
        return cls(tuple((int(t), float(s)) for t, s in row))
