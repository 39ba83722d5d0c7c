"""Speculative decoding: cheap draft tokens, verified in the decode forward itself.

A decoding request with drafts `d_1..d_k` runs `[last token, d_1, .., d_k]` as one extend row
(causal over the drafts, after its KV); the forward returns k + 1 logits rows, row i scoring
the token after `d_1..d_i`. The executor's sampling (`radixkv.core.sampling`) takes the target's
token at each row in turn (`Sampler.verify`): while it equals the draft, the draft is accepted;
the first that differs (or the row after the last draft) is the target's own token, so every
step yields the accepted drafts plus one token and the output is exactly what decoding one by
one gives (greedy), or has the target's distribution (sampling: the speculative-sampling rule);
the scheduler appends them under the stop rules (`radixkv.sched.postprocess`). The K/V of
rejected drafts is dropped (`RequestKV.rollback`), so only tokens of the output ever reach the
radix cache.

Proposers (`speculative_algorithm`), behind `Proposer.propose(req, k)`:
- `ngram`: prompt lookup -- the longest recent n-gram of the request's own tokens that occurred
  earlier in its context, and what followed it there;
- `radix`: what followed the request's whole sequence in the prefix cache (an earlier request
  with the same prompt and answer so far: re-asked questions, templated answers, repeated tool
  outputs), read from the tree without any store of its own; falls back to `ngram`;
- `draft`: a smaller model (`radixkv.sched.draft_model`).

`DraftLength` adapts each request's k to its recent acceptance, down to 0 with an exponential
back-off when too few drafts are kept to pay for the verify forward, so text where drafts
fail costs little over speculation off.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Protocol

from radixkv.mem import PrefixCache
from radixkv.sched.request import Req

NGRAM_MAX, NGRAM_MIN = 4, 2  # n-gram lengths tried, longest first
NGRAM_WINDOW = 4096  # tokens of the request's context searched


class Proposer(Protocol):
    """Draft tokens for a decoding request: at most `k` tokens likely to follow its sequence."""

    name: str

    def propose(self, req: Req, k: int) -> list[int]: ...


class NgramProposer:
    """Prompt lookup over the request's own prompt and output."""

    name = "ngram"

    def propose(self, req: Req, k: int) -> list[int]:
        return ngram_draft(req.seq_ids[-NGRAM_WINDOW:], k)


def ngram_draft(seq: list[int], k: int, max_n: int = NGRAM_MAX, min_n: int = NGRAM_MIN) -> list[int]:
    """What followed the latest earlier occurrence of `seq`'s longest suffix n-gram (n from
    `max_n` down to `min_n`), at most `k` tokens; [] if none recurs."""
    size = len(seq)
    for n in range(min(max_n, size - 1), min_n - 1, -1):
        tail = seq[size - n:]
        first = tail[0]
        for start in range(size - n - 1, -1, -1):  # latest occurrence first
            if seq[start] == first and seq[start: start + n] == tail:
                return seq[start + n: start + n + k]
    return []


class RadixProposer:
    """The prefix cache's continuation of the request's sequence; the n-gram draft otherwise."""

    name = "radix"

    def __init__(self, cache: PrefixCache):
        self.cache = cache
        self.fallback = NgramProposer()
        # a request whose sequence left the tree stays out until the tree gains tokens: skip the walk
        self._left: weakref.WeakKeyDictionary[Req, int] = weakref.WeakKeyDictionary()

    def propose(self, req: Req, k: int) -> list[int]:
        size = self.cache.total_tokens
        if self._left.get(req) != size:
            draft = self.cache.continuation(req.seq_ids, req.namespace, k)
            if draft:
                self._left.pop(req, None)
                return draft
            self._left[req] = size
        return self.fallback.propose(req, k)


@dataclass(slots=True)
class DraftLength:
    """One request's draft length, from its recent acceptance.

    `rate` is a running average of the share of drafted tokens kept. A verify forward costs
    more than a decode step (more tokens; an extend row instead of a decode row), so drafts
    pay only when enough of them are kept: below `MIN_RATE` the request stops drafting for
    2, 4, .. 32 steps, then tries one token again. Otherwise k grows by one after a fully
    accepted draft and shrinks to what was kept (at least one) after a miss."""

    k: int
    max_k: int
    rate: float = 0.6  # optimistic start: the first drafts are tried
    misses: int = 0
    pause: int = 0

    MIN_RATE = 0.4
    DECAY = 0.5
    COLD_PAUSE = 16  # steps a new request waits when recent requests' drafts mostly failed

    @classmethod
    def start(cls, max_k: int, recent_rate: float) -> DraftLength:
        """A new request's draft length, from how well drafts did for the requests before it
        (a draft model that rarely agrees is not tried on every new request's first steps)."""
        d = cls(max_k, max_k, rate=max(recent_rate, 0.0))
        if recent_rate < cls.MIN_RATE:
            d.k, d.pause = 1, cls.COLD_PAUSE
        return d

    def next(self) -> int:
        """Drafts to ask for this step (0 while paused)."""
        if self.pause:
            self.pause -= 1
            return 0
        return self.k

    def update(self, proposed: int, accepted: int) -> None:
        if proposed == 0:
            return
        self.rate = self.DECAY * self.rate + (1 - self.DECAY) * accepted / proposed
        if accepted == 0 or self.rate < self.MIN_RATE:
            self.misses += 1
            self.k = 1
            self.pause = min(32, 2 ** self.misses) if self.rate < self.MIN_RATE or self.misses >= 2 else 0
            return
        self.misses = 0
        self.k = min(self.max_k, accepted + 1 if accepted == proposed else max(1, accepted))


def make_proposer(name: str, cache: PrefixCache) -> Proposer:
    """The proposer `speculative_algorithm=name` names (`draft` is built by the scheduler)."""
    if name == "ngram":
        return NgramProposer()
    if name == "radix":
        return RadixProposer(cache)
    raise ValueError(f"unknown proposer {name!r}")
