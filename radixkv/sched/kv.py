"""RequestKV: a request's KV memory, from admission to release. The only place in the scheduler
that touches the page allocator, the request table and the prefix cache.

    admit(req, match)  load a host-tier continuation back, settle the match, lock it, reserve
                       pages for the first chunk (+ decode headroom), take a table row
    grow(req, n)       slots for the next n tokens (pages already reserved)
    cache_chunk(req)   after an extend: the computed prompt goes into the tree (shared at once)
    release(req)       the request's tokens go into the tree, its lock, pages and row back
                       (both retain what they cached as the request's `retention` asks)
    rollback(req, n)   a forward failed: its n new slots never held KV

With `holds` (`radixkv.sched.holds`), a finished request's cached sequence is held from new
admissions a moment for its next turn: `admit` never evicts a held path (and an admitted
request claims the holds it continues), while the running requests' own growth may end holds.

Invariant (`check`): free + cached + in-flight pages == the pool, where in-flight pages are held
by running requests and not by the tree.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from radixkv.errors import CacheInvariantError
from radixkv.mem import KVMemory, MatchResult, PrefixCache, pages_for_tokens
from radixkv.sched.holds import ReturnHolds
from radixkv.sched.policy import match_key
from radixkv.sched.request import Req, ReqStatus


@dataclass(slots=True)
class BatchRow:
    """One request's part of a forward: its new `tokens` from position `start`, stored at `slots`.

    A speculating request's tokens end with `draft` tokens (not part of its sequence yet): the
    forward scores each, and the ones verification rejects are rolled back."""

    req: Req
    start: int
    tokens: list[int]
    slots: list[int]
    draft: list[int] = field(default_factory=list)

    @property
    def samples(self) -> bool:
        """Whether this forward computes the request's next token (its last new token ends it)."""
        return self.start + len(self.tokens) - len(self.draft) == self.req.seq_len


@dataclass(frozen=True, slots=True)
class Admitted:
    """A request admitted with a cached prefix of `cached_tokens` (of which `host_tokens` came
    back from the host tier, `storage_tokens` of those brought there from storage by its
    prefetch), and the first chunk it runs."""

    row: BatchRow
    cached_tokens: int
    host_tokens: int
    storage_tokens: int = 0


class RequestKV:
    """The KV memory of the requests one scheduler runs (see the module docstring)."""

    def __init__(self, memory: KVMemory, cache: PrefixCache, retract_decode_steps: int,
                 holds: ReturnHolds | None = None):
        self.memory = memory
        self.holds = holds
        self.cache = cache
        self.allocator = memory.allocator
        self.req_table = memory.req_table
        self.page_size = memory.page_size
        self.horizon = retract_decode_steps

    # -- admission -------------------------------------------------------------------------------
    def peek(self, req: Req) -> MatchResult:
        """The cached prefix `req` may reuse; changes nothing."""
        return self.cache.peek(match_key(req), req.namespace)

    def admit(self, req: Req, match: MatchResult | None, chunk: int, headroom_pages: int) -> Admitted | None:
        """Lock `req`'s cached prefix (`match`, the policy's peek this step, or None) and give it
        pages for its first chunk of at most `chunk` tokens, plus decode headroom, on top of
        `headroom_pages` kept for the running requests; or change nothing and return None.

        The chunk and `retract_decode_steps` tokens of headroom are reserved as one span, so
        page rounding is counted once (as `validate` counts it). Evicts only when that makes
        enough room."""
        match = self.cache.settle(match if match is not None else self.peek(req))  # current, on a node
        host_tokens = storage_tokens = 0
        if match.host_tokens:  # copy the host tier's part back rather than recompute it
            loaded = self.cache.load_back(match)
            # what did not fit back is recomputed: this request uses none of it
            host_tokens, match = loaded.num_tokens - match.num_tokens, replace(loaded, host_tokens=0)
            storage_tokens = loaded.from_storage
        self.cache.lock(match.last_node)
        n = min(req.seq_len - match.num_tokens, chunk)
        horizon = min(req.remaining_new_tokens, self.horizon)
        need = pages_for_tokens(match.num_tokens + n + horizon, self.page_size) - len(match.pages)
        # holds keep out new requests only: a return, or a request retracted from the running ones, ends them
        claims = self.holds.claims(match.last_node) if self.holds is not None else []
        if not self.reserve(need + headroom_pages, may_yield=bool(claims) or req.retractions > 0):
            self.cache.unlock(match.last_node)
            return None
        if claims:
            self.holds.claim(claims)
        self.cache.record_use(match)  # now a real use: counts as a hit
        req.seq = self.memory.sequence_from_prefix(match.pages, match.num_tokens)
        req.status, req.last_node, req.kv_len = ReqStatus.RUNNING, match.last_node, match.num_tokens
        req.row = self.req_table.alloc()
        self.req_table.write(req.row, 0, req.seq.slots())
        return Admitted(self.grow(req, n), match.num_tokens, host_tokens, storage_tokens)

    def headroom(self, running: list[Req]) -> int:
        """Pages kept free for the next `retract_decode_steps` decode steps of `running`."""
        return sum(r.seq.pages_needed(min(r.remaining_new_tokens, self.horizon)) for r in running)

    def reserve(self, pages: int, may_yield: bool = True) -> bool:
        """Make `pages` free, evicting unlocked cache leaves if needed; whether it worked.
        Running requests' growth (`may_yield`) ends return holds when evicting is not enough;
        a new admission does not.

        Evicts nothing when even evicting everything evictable would not make enough room."""
        short = pages - self.allocator.free_pages
        if short <= 0:
            return True
        if may_yield and self.holds is not None and short > self.cache.evictable_tokens // self.page_size:
            self.holds.yield_for(short * self.page_size)
        if short > self.cache.evictable_tokens // self.page_size:
            return False
        self.cache.evict(short * self.page_size)
        return self.allocator.free_pages >= pages

    # -- a running request -----------------------------------------------------------------------
    def grow(self, req: Req, n: int, draft: list[int] | None = None) -> BatchRow:
        """Slots for `req`'s next `n` tokens, then its `draft` tokens (their pages must be free)."""
        start = req.kv_len
        draft = draft or []
        slots = req.seq.extend(n + len(draft))
        self.req_table.write(req.row, start, slots)
        req.kv_len += n + len(draft)
        return BatchRow(req, start, req.tokens(start, start + n) + draft, slots, draft)

    def pages_for(self, req: Req, n: int) -> int:
        """Pages `grow(req, n)` would take."""
        return req.seq.pages_needed(n)

    def cache_chunk(self, req: Req) -> None:
        """After an extend: cache what `req` computed so far; it reads the tree's pages from now."""
        match = self.cache.cache_unfinished(req.seq_ids[: req.kv_len], req.seq, req.last_node, req.namespace,
                                            req.retention)
        req.last_node = match.last_node
        self.req_table.write(req.row, 0, req.seq.slots(0, len(match.pages) * self.page_size))

    def release(self, req: Req, hold: bool = False) -> None:
        """Cache what `req` computed, unlock its path, return its pages and row; with `hold` (a
        request that finished, not one retracted or aborted), hold the cached sequence."""
        cached = self.cache.cache_finished(req.seq_ids[: req.kv_len], req.seq, req.last_node, req.namespace,
                                           req.retention)
        if hold and self.holds is not None and cached is not None:
            self.holds.hold(cached.last_node)
        self.req_table.free(req.row)
        req.seq, req.row, req.last_node, req.kv_len = None, None, None, 0

    def rollback(self, req: Req, n: int) -> None:
        """Undo the last `n` slots `req` was given (their forward never ran, or they held
        rejected drafts): they leave its sequence before anything reaches the tree."""
        req.kv_len -= n
        req.seq.truncate(req.kv_len)

    # -- control and checks ----------------------------------------------------------------------
    def flush(self) -> None:
        if self.holds is not None:
            self.holds.release_all()
        self.cache.reset()

    def check(self, running: list[Req], waiting: list[Req], idle: bool, held: list[int] = ()) -> None:
        """Pool, tree and requests agree: every page is free, cached, held by a running request,
        or `held` otherwise (pages a disaggregated decode is receiving).

        Raises `CacheInvariantError` (never a bare assert, which `python -O` would drop)."""
        cached = self.cache.cached_pages()
        inflight = set()
        try:
            for req in running:
                req.check()
                inflight.update(p for p in req.seq.pages if p not in cached)
            for req in waiting:
                req.check()
            inflight.update(p for p in held if p not in cached)
        except AssertionError as e:
            raise CacheInvariantError(f"request state: {e}") from e
        self.cache.check_invariants(inflight_pages=len(inflight))
        if self.holds is not None:
            self.holds.check()
        if idle:
            if self.cache.protected_tokens:
                raise CacheInvariantError("a lock outlived its request")
            if self.allocator.free_tokens + self.cache.evictable_tokens != self.allocator.total_tokens:
                raise CacheInvariantError("idle, yet some pages are neither free nor evictable")

    def stats(self) -> dict[str, int | float]:
        a, cache = self.allocator, self.cache
        return {"total_tokens": a.total_tokens, "free_tokens": a.free_tokens,
                "used_tokens": a.total_tokens - a.free_tokens,
                "token_usage": (a.total_tokens - a.free_tokens) / a.total_tokens,
                "evictable_tokens": cache.evictable_tokens, "protected_tokens": cache.protected_tokens,
                "cached_tokens_in_tree": cache.total_tokens, "evicted_tokens": cache.stats_evicted_tokens,
                "retained_tokens": cache.retained_tokens,
                "held_sequences": len(self.holds) if self.holds is not None else 0} | (
                self.holds.stats.to_dict() if self.holds is not None else {})
