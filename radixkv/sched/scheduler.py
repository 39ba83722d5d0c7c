"""The scheduler: decides each step of continuous batching over the radix cache; runs nothing.

One request's life, top to bottom (each step's details live in their own module):
  accept    -> checked, queued (WAITING); a constrained one waits apart while the engine core
               compiles its grammar (`grammar_compiled` / `grammar_refused` end the wait)
  schedule  -> decode rows, then prefill chunks: match prefix, lock it, reserve pages, write
               req_to_token: a `ScheduleOutput`                              (admission, kv)
  (the engine core runs it and samples: a `ModelOutput`)
  update    -> append tokens under the stop rules                           (postprocess)
               each extend's computed prompt goes into the tree; a finished request's prompt +
               output too, then its lock, pages and row go back; one output per request that
               produced something                                           (ReqOutput)
Under memory pressure admission evicts, decode evicts then retracts running requests (their
KV goes into the tree, they re-queue at the front); nothing fails for lack of pages alone.

No model, sampler or tensor here: a test drives `schedule` and `update` with a hand-made
`ModelOutput` over a small `KVMemory` and prefix cache.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from radixkv.config import EngineConfig
from radixkv.errors import ErrorKind, InvalidRequestError
from radixkv.grammar_spec import GrammarSpec
from radixkv.mem import KVMemory, PrefixCache
from radixkv.mem.miss_causes import explain, retokenized
from radixkv.outputs import ReqOutput
from radixkv.sched.admission import Admission
from radixkv.sched.holds import ReturnHolds
from radixkv.sched.kv import RequestKV
from radixkv.sched.policy import SchedulePolicy, match_key
from radixkv.sched.postprocess import PostProcessor
from radixkv.sched.prefetch import Prefetcher
from radixkv.sched.records import ModelOutput, ScheduleOutput
from radixkv.sched.request import Req, ReqStatus
from radixkv.sched.speculative import DraftLength, Proposer
from radixkv.sched.stats import SchedulerStats
from radixkv.sched.stop import Decoder
from radixkv.validation import RequestLimits, check_request

logger = logging.getLogger(__name__)


class Scheduler:
    """Decides continuous batching over `cache` and `memory`'s pool (see the module docstring).

    Not thread-safe: one caller drives it (the engine core, on `SchedulerLoop`'s thread), except
    `validate`. `limits` are what the model and pool allow; `decoder` (the tokenizer) checks
    stop strings and attributes misses to re-tokenized text; `proposer` drafts tokens for
    speculative decoding; `prefetcher` reads waiting requests' pages from the storage tier.
    `on_accept` / `on_finish` callbacks (telemetry) see every request as it is accepted and as
    it finishes."""

    def __init__(self, config: EngineConfig, memory: KVMemory, cache: PrefixCache, limits: RequestLimits,
                 eos_ids: frozenset[int] = frozenset(), decoder: Decoder | None = None,
                 proposer: Proposer | None = None, prefetcher: Prefetcher | None = None,
                 stats: SchedulerStats | None = None, transfers: Any = None):
        self.config = config
        self.memory = memory
        self.cache = cache
        self.limits = limits
        self.decoder = decoder
        self.proposer = proposer
        self.prefetcher = prefetcher
        self.stats = stats if stats is not None else SchedulerStats()
        self.waiting: deque[Req] = deque()
        self.running: list[Req] = []
        self.reqs: dict[str, Req] = {}
        self.grammar_waiting: dict[GrammarSpec, list[Req]] = {}  # requests whose grammar is compiling
        self.on_accept: list[Callable[[Req], None]] = []
        self.on_finish: list[Callable[[Req], None]] = []
        self.policy = SchedulePolicy(config.scheduler.schedule_policy, cache, config.scheduler.starvation_limit)
        hold = config.scheduler.hold_finished_seconds
        holds = ReturnHolds(cache, hold) if hold > 0 and self.policy.cache_aware else None
        self.kv = RequestKV(memory, cache, config.scheduler.retract_decode_steps, holds)
        self.admission = Admission(config, self.kv, self.policy, self.stats, self.waiting, self.running,
                                   proposer, limits.context_length, prefetcher, self._explain)
        self.post = PostProcessor(eos_ids, limits.context_length, decoder, self.stats)
        self.transfers = transfers  # PrefillSide / DecodeSide (radixkv.disagg.sides) of a disaggregated server
        if transfers is not None:
            transfers.end_request = self._finish

    def _explain(self, req: Req) -> dict[str, int]:
        """`req`'s prompt by cause, at its first admission (see `radixkv.mem.miss_causes`). The
        tokens a cache may never serve (the last, which runs for its logits, and those whose
        prompt log-probs were asked for) count as `page_tail`: cached or not, they run."""
        key = match_key(req)
        device = req.cached_tokens - req.host_hit_tokens - req.storage_hit_tokens
        causes = explain(self.cache, key, req.namespace, device, req.host_hit_tokens, req.storage_hit_tokens)
        if self.decoder is not None:
            causes = retokenized(self.cache, key, req.namespace, causes, self.decoder.decode)
        causes["page_tail"] += len(req.prompt_ids) - len(key)
        return causes

    # -- requests in and out ---------------------------------------------------------------------
    def add_request(self, req: Req) -> None:
        """Check and queue `req` (one without a grammar to compile); raises
        `InvalidRequestError` and changes nothing if it is bad."""
        self.check(req)
        self.accept(req)

    def check(self, req: Req) -> None:
        """Whether `req` may be accepted now: a fresh id, and it could ever run here."""
        if req.rid in self.reqs:
            raise InvalidRequestError(f"request id {req.rid!r} is already in use")
        if req.bootstrap is not None and self.transfers is None:
            raise InvalidRequestError(f"bootstrap_room={req.bootstrap.room}: this server is not part of a "
                                      "prefill/decode pair (--disaggregation-mode null); send it without the "
                                      "bootstrap_* fields")
        self.validate(req)

    def prepare(self, req: Req) -> None:
        """What this server runs of a checked `req`: on a prefill server, its prompt alone."""
        if req.bootstrap is not None:
            self.transfers.prepare(req)

    def accept(self, req: Req, grammar_compiling: bool = False) -> None:
        """`req` passed `check`: it is the scheduler's until it finishes. Queued now, or when its
        grammar (`req.params.grammar`) has compiled if `grammar_compiling`."""
        if req.retention is not None:  # --max-cache-retention caps every hint (0: none is kept)
            req.retention = req.retention.capped(self.config.cache.max_cache_retention) or None
        if self.proposer is not None:
            req.spec = DraftLength.start(self.config.spec.speculative_num_draft_tokens, self.stats.spec_recent_rate)
        self.reqs[req.rid] = req
        for hook in self.on_accept:
            hook(req)
        if grammar_compiling:
            self.grammar_waiting.setdefault(req.params.grammar, []).append(req)
        else:
            self._enqueue(req)

    def _enqueue(self, req: Req) -> None:
        """Queue `req`; one of a prefill/decode pair goes through its side (a decode server's
        waits there for its prompt's pages first)."""
        if req.bootstrap is not None:
            self.transfers.accept(req, self.waiting)
        else:
            self.waiting.append(req)

    def grammar_compiled(self, spec: GrammarSpec, matcher: Callable[[], Any]) -> None:
        """`spec` compiled: each request waiting for it gets its own `matcher()` and is queued."""
        for req in self.grammar_waiting.pop(spec, []):
            req.grammar = matcher()
            self._enqueue(req)

    def poll_transfers(self) -> list[ReqOutput]:
        """A disaggregated server's transfers: pages that arrived queue their requests, failed
        transfers end theirs (their outputs), finished offers unlock."""
        return self.transfers.poll(self.waiting) if self.transfers is not None else []

    def grammar_refused(self, spec: GrammarSpec, message: str, kind: ErrorKind) -> list[ReqOutput]:
        """`spec` cannot be compiled: the requests waiting for it end with that error."""
        outputs = []
        for req in self.grammar_waiting.pop(spec, []):
            self._finish(req, {"type": "abort", "message": message})
            outputs.append(req.take_output(message, kind))
        return outputs

    def validate(self, req: Req) -> None:
        """Whether `req` could ever run here (raises `InvalidRequestError` naming the field).

        Reads only what never changes (model, context, pool size): safe from any thread."""
        check_request(req.prompt_ids, req.params, self.limits)
        req.logprob.check_prompt(len(req.prompt_ids))

    def abort(self, rid: str, message: str = "aborted by request", error_kind: ErrorKind | None = None
              ) -> ReqOutput | None:
        """Stop `rid` wherever it is; everything it held is returned. None if unknown/finished.

        A plain abort ends the request normally (finish_reason "abort"); with an `error_kind`
        its output carries `message` as an error."""
        req = self.reqs.get(rid)
        if req is None or req.status is ReqStatus.FINISHED:
            return None
        if req in self.waiting:
            self.waiting.remove(req)
        elif self.transfers is not None:
            self.transfers.abort(req)
        if self.prefetcher is not None:
            self.prefetcher.forget(req)
        spec = req.params.grammar
        if req in self.grammar_waiting.get(spec, ()):
            self.grammar_waiting[spec].remove(req)
            if not self.grammar_waiting[spec]:  # nobody waits for it now: the compile may finish unread
                del self.grammar_waiting[spec]
        self._finish(req, {"type": "abort", "message": message})
        return req.take_output(error=message if error_kind else None, error_kind=error_kind)

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running or self.grammar_waiting or
                    (self.transfers is not None and self.transfers.busy))

    @property
    def only_compiling(self) -> bool:
        """Every request in flight waits for its grammar."""
        return bool(self.grammar_waiting) and not self.waiting and not self.running

    # -- one step: decide, then take the result back ---------------------------------------------
    def schedule(self) -> ScheduleOutput:
        """The next forward: a decode token for every decoding request plus prefill chunks of
        admitted requests (pages reserved, request-table rows written). No rows when nothing can
        run; then a queue head that cannot start even in an idle pool (validation should make
        that impossible) ends rather than spin, in `finished`."""
        if self.prefetcher is not None:
            self.prefetcher.poll(self.waiting)
        if self.kv.holds is not None:
            self.kv.holds.expire()
        decided = self.admission.schedule()
        if decided is not None:
            return decided
        if self.kv.holds is not None and len(self.kv.holds) and self.waiting and not self.running:
            time.sleep(0.001)  # the queue waits a moment for held sequences to come back (holds)
            return ScheduleOutput([], 0)
        if not self.waiting or self.running:
            if self.transfers is not None and self.transfers.busy and not self.running:
                time.sleep(0.001)  # only transfers in flight: do not spin
            return ScheduleOutput([], 0)
        if self.prefetcher is not None and self.prefetcher.pending:  # requests wait on storage reads
            self.prefetcher.wait(0.002)
            return ScheduleOutput([], 0)
        if self.transfers is not None and self.transfers.busy:  # requests wait on their pages
            time.sleep(0.001)
            return ScheduleOutput([], 0)
        req = self.waiting.popleft()
        logger.error("request %s cannot be admitted into an idle pool; aborting it", req.rid)
        self._finish(req, {"type": "abort", "message": "cannot fit in the KV pool even when idle"})
        return ScheduleOutput([], 0, [req.take_output()])

    def update(self, out: ScheduleOutput, result: ModelOutput) -> list[ReqOutput]:
        """Take the forward of `out` back: append the sampled tokens, finish requests that stop
        (their pages go back, the tree keeps prompt + output), put computed prompt chunks in the
        tree; one output per request that produced something.

        A failed forward (`result.error`) rolls the batch's new KV slots back (so nothing that
        was never computed reaches the cache) and ends its requests with the error."""
        if result.error is not None:
            self.rollback(out)
            return self._fail(out.reqs, result.error)
        outputs = []
        for sampled in self.post.process(out, result):
            if sampled.rejected:  # drafts it did not keep: their KV goes before anything is cached
                self.kv.rollback(sampled.req, sampled.rejected)
            if sampled.finish is not None:
                self._finish(sampled.req, sampled.finish)
            outputs.append(sampled.req.take_output())
        for row in out.rows[out.num_decode:]:  # share computed prompts with later requests
            if row.req.status is ReqStatus.RUNNING:
                self.kv.cache_chunk(row.req)
        return outputs

    def rollback(self, out: ScheduleOutput) -> None:
        """`out` never ran: its new KV slots held nothing."""
        for row in out.rows:
            if row.req.status is ReqStatus.RUNNING:
                self.kv.rollback(row.req, len(row.tokens))

    def _fail(self, reqs: list[Req], message: str) -> list[ReqOutput]:
        outputs = []
        for req in reqs:
            if req.status is not ReqStatus.FINISHED:
                self._finish(req, {"type": "abort", "message": message})
                outputs.append(req.take_output(message, ErrorKind.INTERNAL))
        return outputs

    def _finish(self, req: Req, reason: dict[str, Any]) -> None:
        if self.prefetcher is not None:
            self.prefetcher.forget(req)
        if req.status is ReqStatus.RUNNING:
            self.kv.release(req, hold=reason.get("type") != "abort")
            self.running.remove(req)
        if self.kv.holds is not None and not self.running and not self.waiting:
            self.kv.holds.release_all()  # nothing wants the pages: no need to hold them
        req.status, req.finish_reason = ReqStatus.FINISHED, reason
        req.finish_time = time.perf_counter()
        self.stats.finished_requests += 1
        del self.reqs[req.rid]
        if req.bootstrap is not None:
            self.transfers.finished(req, reason)
        for hook in self.on_finish:
            hook(req)

    # -- cache control, checks and stats ---------------------------------------------------------
    def flush_cache(self) -> bool:
        """Drop every cached prefix; refused (False) while requests are queued or running."""
        if self.has_work:
            return False
        self.kv.flush()
        return True

    def check_invariants(self) -> None:
        """Pool, tree and requests agree (`RequestKV.check`); raises `CacheInvariantError`."""
        compiling = [req for reqs in self.grammar_waiting.values() for req in reqs]
        held = self.transfers.held_pages() if self.transfers is not None else []
        self.kv.check(self.running, list(self.waiting) + compiling, idle=not self.has_work, held=held)

    def get_stats(self) -> dict[str, Any]:
        """Counters, queue lengths and the KV pool's and tree's token counts."""
        return self.stats.to_dict() | {
            "waiting_requests": len(self.waiting) + sum(map(len, self.grammar_waiting.values())) + (
                self.transfers.waiting_requests if self.transfers is not None else 0),
            "running_requests": len(self.running),
            "max_cache_retention": self.config.cache.max_cache_retention,
        } | self.kv.stats() | (self.transfers.stats.to_dict() if self.transfers is not None else {})
