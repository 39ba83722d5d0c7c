"""Admission: which requests run in the next forward, and how many tokens each.

Decode rows come first (running requests never stall behind a long prompt): one token for every
decoding request, retracting the latest arrivals when memory runs out (their KV goes into the
tree, they re-queue at the front). Then prefill chunks in the rest of the token budget: chunked
prefills continue, then waiting requests are admitted in policy order until the budget, a row
or memory runs out. After a retraction memory is short, so nothing new is admitted that step.
Return holds (`radixkv.sched.holds`) keep new admissions off finished requests' sequences, and
keep an idle pool's queue out only as long as returns have been seen to take.
Cache-aware policies also skip a request whose uncached prefix an earlier admission of the same
batch is about to compute (it hits that prefix next step).
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable

from radixkv.config import EngineConfig
from radixkv.sched.kv import BatchRow, RequestKV
from radixkv.sched.policy import InBatchPrefixes, SchedulePolicy, match_key
from radixkv.sched.prefetch import Prefetcher
from radixkv.sched.records import ScheduleOutput
from radixkv.sched.request import Req, ReqStatus
from radixkv.sched.stats import SchedulerStats

logger = logging.getLogger(__name__)


class Admission:
    """Builds each step's `ScheduleOutput` over the scheduler's `waiting` queue and `running` list."""

    def __init__(self, config: EngineConfig, kv: RequestKV, policy: SchedulePolicy, stats: SchedulerStats,
                 waiting: deque[Req], running: list[Req], proposer=None, context_length: int | None = None,
                 prefetcher: Prefetcher | None = None, explain: Callable[[Req], dict[str, int]] | None = None):
        self.config, self.kv, self.policy, self.stats = config, kv, policy, stats
        self.waiting, self.running = waiting, running
        self.proposer, self.context_length = proposer, context_length  # speculative decoding
        self.prefetcher = prefetcher  # storage reads that waiting requests may wait on
        self.explain = explain  # a request's prompt split by cause (miss attribution), at first admission

    def schedule(self) -> ScheduleOutput | None:
        """The next forward's rows, or None when nothing can run."""
        decode, retracted = self._decode_rows()
        budget = max(1, self.config.scheduler.max_prefill_tokens - len(decode))  # prefill always progresses
        rows = decode + self._prefill_rows(budget, admit=not retracted)
        holds = self.kv.holds
        if not rows and not self.running and self.waiting and holds is not None and len(holds):
            holds.end_idle()  # nothing runs: holds keep the queue out only as long as returns take
            rows = self._prefill_rows(self.config.scheduler.max_prefill_tokens, admit=True)
        while not rows and self.running:
            # every running request is stuck mid-prefill for lack of pages: the latest yields
            self.retract(max(self.running, key=lambda r: r.arrival_time))
            rows = self._prefill_rows(self.config.scheduler.max_prefill_tokens, admit=True)
        return ScheduleOutput(rows, len(decode)) if rows else None

    def retract(self, req: Req) -> None:
        """Give `req`'s KV back (it goes into the tree) and queue it again, first."""
        logger.info("retracting %s (%d tokens) to free KV pages", req.rid, req.kv_len)
        self.kv.release(req)
        self.running.remove(req)
        req.status = ReqStatus.WAITING
        req.retractions += 1
        self.stats.retractions += 1
        self.waiting.appendleft(req)

    def _decode_rows(self) -> tuple[list[BatchRow], bool]:
        """One new token for every decoding request, retracting some if memory runs out.

        Returns the rows and whether anything was retracted."""
        reqs = [r for r in self.running if r.is_decoding]
        drafts = self._drafts(reqs)
        if drafts and self.kv.reserve(sum(self.kv.pages_for(r, 1 + len(drafts.get(r.rid, ()))) for r in reqs)):
            return [self.kv.grow(r, 1, drafts.get(r.rid)) for r in reqs], False
        retracted = False  # no room for drafts: plain decode, retracting if even that does not fit
        while reqs and not self.kv.reserve(sum(self.kv.pages_for(r, 1) for r in reqs)):
            victim = max(reqs, key=lambda r: r.arrival_time)  # the latest to arrive yields
            self.retract(victim)
            reqs.remove(victim)
            retracted = True
        return [self.kv.grow(r, 1) for r in reqs], retracted

    def _drafts(self, reqs: list[Req]) -> dict[str, list[int]]:
        """Draft tokens of each speculating request this step (none past its token budget)."""
        if self.proposer is None:
            return {}
        asks = []
        for r in reqs:
            if r.spec is None:
                continue
            k = min(r.spec.next(), r.remaining_new_tokens - 1, self.context_length - r.seq_len - 1)
            if k > 0:
                asks.append((r, k))
        if hasattr(self.proposer, "propose_batch"):  # one batched draft model run for all of them
            drafts = self.proposer.propose_batch(asks)
        else:
            drafts = {r.rid: self.proposer.propose(r, k) for r, k in asks}
        out = {}
        for r, k in asks:
            draft = drafts.get(r.rid, [])[:k]
            if draft and r.grammar is not None:  # a draft the grammar rejects ends there
                draft = draft[: r.grammar.valid_prefix(draft)]
            if draft:
                out[r.rid] = draft
        return out

    def _prefill_rows(self, budget: int, admit: bool) -> list[BatchRow]:
        """Continue chunked prefills, then (if `admit`) admit waiting requests, within `budget`
        new tokens."""
        rows: list[BatchRow] = []
        for req in [r for r in self.running if r.is_prefilling]:
            n = min(self._chunk(req), budget)
            if n <= 0 or not self.kv.reserve(self.kv.pages_for(req, n)):
                return rows  # admitted prefills finish first
            rows.append(self.kv.grow(req, n))
            budget -= n
        if admit and self.waiting and budget > 0:
            rows += self._admit(budget)
        return rows

    def _adapter_fits(self, adapter: str) -> bool:
        """Whether a request of LoRA adapter `adapter` may join the running ones: a forward
        holds at most `max_loras_per_batch` distinct adapters."""
        running = {r.lora for r in self.running if r.lora is not None}
        return adapter in running or len(running) < self.config.lora.max_loras_per_batch

    def _admit(self, budget: int) -> list[BatchRow]:
        """Admit waiting requests in policy order until the budget, a row or memory runs out."""
        in_batch = InBatchPrefixes()
        rows, admitted = [], set()
        for req in self.policy.order(self.waiting):
            if len(self.running) >= self.config.scheduler.max_running_requests or budget <= 0:
                break
            key = match_key(req)
            if self.policy.cache_aware and in_batch.shares(key, req.match_len):
                continue  # computed once by an earlier request of this batch, then hit
            if self.prefetcher is not None and not self.prefetcher.admit_ready(req):
                continue  # its pages are still on their way from storage
            if req.lora is not None and not self._adapter_fits(req.lora):
                continue  # every adapter slot is taken by running requests' adapters
            chunk = min(budget, self.config.scheduler.chunked_prefill_size or req.seq_len)
            done = self.kv.admit(req, req.peeked, chunk, self.kv.headroom(self.running))
            req.peeked = None  # a look is good for this step only
            if done is None:
                break
            self.running.append(req)
            if self.prefetcher is not None:
                self.prefetcher.forget(req)
            if not req.admitted_once:
                req.admitted_once = True
                req.admit_time = time.perf_counter()
                req.cached_tokens = min(done.cached_tokens, len(req.prompt_ids))
                req.host_hit_tokens = min(done.host_tokens, req.cached_tokens)
                req.storage_hit_tokens = min(done.storage_tokens, req.host_hit_tokens)
                req.host_hit_tokens -= req.storage_hit_tokens
                self.stats.record_admission(len(req.prompt_ids), req.cached_tokens, req.host_hit_tokens,
                                            req.storage_hit_tokens)
                if self.explain is not None:
                    req.cache_causes = self.explain(req)
                    self.stats.record_causes(req.cache_causes)
            admitted.add(req.rid)
            in_batch.add(key)
            rows.append(done.row)
            budget -= len(done.row.tokens)
        for req in list(self.waiting):
            req.peeked = None
            if req.rid in admitted:
                self.waiting.remove(req)
            elif admitted:  # passed over: a later request went ahead of it (a step that admits
                req.passed_over += 1  # nobody passes over no one)
        return rows

    def _chunk(self, req: Req) -> int:
        """Prompt tokens `req` computes next, at most the chunked-prefill size."""
        return min(req.seq_len - req.kv_len, self.config.scheduler.chunked_prefill_size or req.seq_len)
