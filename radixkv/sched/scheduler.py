"""The scheduler: continuous batching over the radix cache.

One request's life, top to bottom:
  add_request  -> validated, queued (WAITING)
  step         -> one forward over a mixed batch: a decode token for every decoding request,
                  then prefill chunks (continued, then newly admitted) in the token budget:
    admit      -> match prefix, lock it, allocate pages for a chunk (evicting unlocked leaves),
                  write req_to_token                                           (RUNNING)
    forward    -> model runner: store K/V, attention, logits
    sample     -> next token where a prompt (or decode step) completed
    cache      -> after each extend, the computed prompt goes into the tree (cache_unfinished)
    finish     -> prompt + output cached, lock released, pages and row returned (FINISHED)
Under memory pressure admission evicts, decode evicts then retracts running requests (their
KV goes into the tree, they re-queue at the front); nothing fails for lack of pages alone.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from typing import Any

import torch

from radixkv.attention import ForwardMode
from radixkv.config import EngineConfig
from radixkv.errors import CacheInvariantError, ErrorKind, InvalidRequestError
from radixkv.mem import KVMemory, PrefixCache, make_prefix_cache, pages_for_tokens
from radixkv.model.runner import ModelRunner
from radixkv.tp.launch import load_runner
from radixkv.model.sampler import Sampler, SamplingRow
from radixkv.sched.batch import ScheduledBatch
from radixkv.sched.logprobs import prompt_rows, token_logprobs
from radixkv.outputs import ReqOutput
from radixkv.sched.stats import SchedulerStats
from radixkv.sched.policy import InBatchPrefixes, SchedulePolicy, match_key
from radixkv.sched.request import Req, ReqStatus
from radixkv.sched.stop import Decoder, finish_reason, suppressed_ids
from radixkv.validation import RequestLimits, check_request

logger = logging.getLogger(__name__)


class Scheduler:
    """Continuous batching over the radix cache for one `ModelRunner` (see the module docstring).

    Not thread-safe: one caller drives `add_request`, `step` and `abort` (in the Engine and the
    server, that is `SchedulerLoop`). `memory` is the KV memory the runner computes into.
    """

    def __init__(self, config: EngineConfig, runner: ModelRunner, memory: KVMemory,
                 decoder: Decoder | None = None, eos_ids: frozenset[int] = frozenset()):
        self.config = config
        self.runner = runner
        self.memory = memory
        self.decoder = decoder
        self.tokenizer = None  # set by `load`
        self.eos_ids = frozenset(eos_ids) | frozenset(runner.model_config.eos_token_ids)
        self.page_size = config.page_size
        self.allocator = memory.allocator
        self.req_table = memory.req_table
        self.cache: PrefixCache = make_prefix_cache(
            self.allocator, config.eviction_policy, runner.model_config.attention_scale,
            host_tier=memory.host, disabled=config.disable_radix_cache)
        self.policy = SchedulePolicy(config.schedule_policy, self.cache, config.starvation_limit)
        self.sampler = Sampler(runner.device, config.random_seed)
        self.waiting: deque[Req] = deque()
        self.running: list[Req] = []
        self.reqs: dict[str, Req] = {}
        self.stats = SchedulerStats()
        self._grammars = None  # GrammarCompiler, made on the first constrained request

    @classmethod
    def load(cls, config: EngineConfig, progress: bool = True) -> Scheduler:
        """The model runner, its KV memory and tokenizer (for stop strings), and a scheduler over
        them, all from one `EngineConfig`; `scheduler.tokenizer` is None for a bare checkpoint."""
        from radixkv.tokenizer import Tokenizer

        runner = load_runner(config, progress=progress)
        try:
            tokenizer = Tokenizer.from_model_dir(runner.model_dir)
            eos = tokenizer.eos_token_ids if tokenizer else frozenset()
            scheduler = cls(config, runner, runner.memory, tokenizer, eos)
        except BaseException:
            runner.close()  # the other tensor-parallel ranks, if any
            raise
        scheduler.tokenizer = tokenizer
        return scheduler

    # -- requests in and out ---------------------------------------------------------------------
    def add_request(self, req: Req) -> None:
        """Validate and queue; raises `InvalidRequestError` and changes nothing if `req` is bad."""
        if req.rid in self.reqs:
            raise InvalidRequestError(f"request id {req.rid!r} is already in use")
        self.validate(req)
        spec = req.params.grammar
        if spec is not None:
            req.grammar = self.grammar_compiler().matcher(spec)
        if req.params.seed is not None:
            req.generator = Sampler.request_generator(req.params.seed, self.runner.device)
        self.reqs[req.rid] = req
        self.waiting.append(req)

    def grammar_compiler(self):
        """Grammars compiled against this model's tokenizer (cached by source)."""
        if self._grammars is None:
            if self.tokenizer is None:
                raise InvalidRequestError("constrained decoding needs the model's tokenizer, which this "
                                          "checkpoint lacks")
            from radixkv.constrained import GrammarCompiler

            self._grammars = GrammarCompiler(self.tokenizer.hf, self.runner.model_config.vocab_size, self.eos_ids)
        return self._grammars

    @property
    def limits(self) -> RequestLimits:
        """What any request here must fit: vocabulary, context, the pool's capacity."""
        return RequestLimits(self.runner.model_config.vocab_size, self.runner.context_length,
                             self.allocator.total_tokens, self.page_size, self.decoder is not None)

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
        if req.status is ReqStatus.WAITING:
            self.waiting.remove(req)
        self._finish(req, {"type": "abort", "message": message})
        return self._output(req, error=message if error_kind else None, error_kind=error_kind)

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    # -- the loop --------------------------------------------------------------------------------
    def step(self) -> list[ReqOutput]:
        """Run one forward over a mixed batch: a decode token for every decoding request plus
        prefill chunks of admitted requests.

        If the forward raises, the batch's new KV slots are rolled back (so nothing that was
        never computed can reach the cache) and its requests end with an error output; the
        other requests keep running.
        """
        start = time.perf_counter()
        batch = self._schedule()
        if batch is None:
            return self._fail_unadmittable()
        forward_start = time.perf_counter()
        try:
            logits = self.runner.forward(batch.forward)  # (N, V), one row per sampling request
        except Exception as e:
            logger.exception("model forward failed; ending the %d request(s) of its batch", len(batch.reqs))
            self._rollback(batch)
            return self._fail(batch.reqs, f"the model forward failed: {type(e).__name__}: {e}")
        except BaseException:
            self._rollback(batch)
            raise
        forward_time = time.perf_counter() - forward_start
        outputs = self._process(batch, logits)
        self.stats.record_step(batch.num_decode, batch.num_prefill_tokens,
                               time.perf_counter() - start, forward_time)
        if self.config.log_level == "debug":
            self.check_invariants()
        return outputs

    def _schedule(self) -> ScheduledBatch | None:
        """Decode rows first (running requests never stall behind a long prompt), then prefill
        chunks in the rest of the token budget; under memory pressure, retract."""
        decode, retracted = self._schedule_decode()
        # after a retraction memory is short: admitting now would only thrash
        budget = max(1, self.config.max_prefill_tokens - len(decode))  # prefill always progresses
        chosen = decode + self._schedule_prefill(budget, admit=not retracted)
        while not chosen and self.running:
            # every running request is stuck mid-prefill for lack of pages: the latest yields
            self._retract(max(self.running, key=lambda r: r.arrival_time))
            chosen = self._schedule_prefill(self.config.max_prefill_tokens, admit=True)
        return self._batch(chosen, num_decode=len(decode)) if chosen else None

    def _fail_unadmittable(self) -> list[ReqOutput]:
        """Nothing runs and the queue head still cannot start: validation should make this
        impossible, so end it with an error rather than spin."""
        if not self.waiting:
            return []
        req = self.waiting.popleft()
        logger.error("request %s cannot be admitted into an idle pool; aborting it", req.rid)
        self._finish(req, {"type": "abort", "message": "cannot fit in the KV pool even when idle"})
        return [self._output(req)]

    def _fail(self, reqs: list[Req], message: str) -> list[ReqOutput]:
        outputs = []
        for req in reqs:
            if req.status is not ReqStatus.FINISHED:
                self._finish(req, {"type": "abort", "message": message})
                outputs.append(self._output(req, error=message, error_kind=ErrorKind.INTERNAL))
        return outputs

    def _rollback(self, batch: ScheduledBatch) -> None:
        for req, tokens in zip(batch.reqs, batch.new_tokens):
            if req.status is ReqStatus.RUNNING:
                req.kv_len -= len(tokens)
                req.seq.truncate(req.kv_len)

    def _schedule_decode(self) -> tuple[list, bool]:
        """One new token for every decoding request, retracting some if memory runs out.

        Returns the grown rows and whether anything was retracted."""
        reqs = [r for r in self.running if r.is_decoding]
        retracted = False
        while reqs and not self._reserve(sum(r.seq.pages_needed(1) for r in reqs)):
            victim = max(reqs, key=lambda r: r.arrival_time)  # the latest to arrive yields
            self._retract(victim)
            reqs.remove(victim)
            retracted = True
        return [self._grow(r, 1) for r in reqs], retracted

    def _schedule_prefill(self, budget: int, admit: bool) -> list:
        """Continue chunked prefills, then (if `admit`) admit waiting requests, within `budget`
        new tokens."""
        chosen: list[tuple[Req, int, list[int], list[int]]] = []  # (req, start, tokens, slots)
        blocked = False
        for req in [r for r in self.running if r.is_prefilling]:
            n = min(self._chunk(req), budget)
            if n <= 0 or not self._reserve(req.seq.pages_needed(n)):
                blocked = True
                break
            chosen.append(self._grow(req, n))
            budget -= n
        if admit and self.waiting and budget > 0 and not blocked:  # admitted prefills finish first
            self._admit(chosen, budget)
        return chosen

    def _admit(self, chosen: list, budget: int) -> int:
        """Admit waiting requests in policy order until the budget, a row or memory runs out."""
        in_batch = InBatchPrefixes()
        admitted = set()
        for req in self.policy.order(self.waiting):
            if len(self.running) >= self.config.max_running_requests or budget <= 0:
                break
            key = match_key(req)
            if self.policy.cache_aware and in_batch.shares(key, req.match_len):
                continue  # computed once by an earlier request of this batch, then hit
            grown = self._try_admit(req, key, budget)
            if grown is None:
                break
            admitted.add(req.rid)
            in_batch.add(key)
            chosen.append(grown)
            budget -= len(grown[2])
        for req in list(self.waiting):
            if req.rid in admitted:
                self.waiting.remove(req)
            else:
                req.passed_over += 1
        return budget

    def _try_admit(self, req: Req, key: list[int], budget: int) -> tuple | None:
        """Lock `req`'s cached prefix and give it pages for its first chunk, or change nothing.

        Reserves the chunk plus `retract_decode_steps` tokens of decode headroom as one span
        (so page rounding is counted once, as `validate` counts it), on top of the headroom of
        every running request. Evicts only when that makes enough room.
        """
        peek = self.cache.match_prefix(key, req.namespace, record_hit=False)
        host_tokens = 0
        if peek.host_tokens:  # copy the host tier's part back rather than recompute it
            loaded = self.cache.load_back(peek, key, req.namespace)
            host_tokens, peek = loaded.num_tokens - peek.num_tokens, loaded
        self.cache.lock(peek.last_node)
        n = min(req.seq_len - peek.num_tokens, budget, self._chunk_cap(req.seq_len))
        horizon = min(req.remaining_new_tokens, self.config.retract_decode_steps)
        need = pages_for_tokens(peek.num_tokens + n + horizon, self.page_size) - len(peek.pages)
        if not self._reserve(need + self._decode_reserve()):
            self.cache.unlock(peek.last_node)
            return None
        match = self.cache.match_prefix(key, req.namespace)  # now a real use: counts as a hit
        assert match.last_node is peek.last_node and match.pages == peek.pages
        req.seq = self.memory.sequence_from_prefix(match.pages, match.num_tokens)
        req.status, req.last_node, req.kv_len = ReqStatus.RUNNING, match.last_node, match.num_tokens
        req.row = self.req_table.alloc()
        self.req_table.write(req.row, 0, req.seq.slots())
        if not req.admitted_once:
            req.admitted_once = True
            req.cached_tokens = min(match.num_tokens, len(req.prompt_ids))
            self.stats.record_admission(len(req.prompt_ids), req.cached_tokens,
                                        min(host_tokens, req.cached_tokens))
        self.running.append(req)
        return self._grow(req, n)

    def _batch(self, chosen: list, num_decode: int) -> ScheduledBatch:
        """The forward for `chosen` rows (req, start, tokens, slots); the first `num_decode` are
        decode rows."""
        reqs = [c[0] for c in chosen]
        samples = [start + len(toks) == r.seq_len for r, start, toks, _ in chosen]
        slots = [s for c in chosen for s in c[3]]
        rows = [[] if b < num_decode else prompt_rows(r.logprob, len(r.prompt_ids), start, len(toks))
                for b, (r, start, toks, _) in enumerate(chosen)]
        mode = ForwardMode.DECODE if all(len(c[2]) == 1 for c in chosen) else ForwardMode.EXTEND
        return ScheduledBatch.build(mode, reqs, [c[1] for c in chosen], [c[2] for c in chosen],
                                    slots, samples, num_decode, self.runner.device, rows)

    def _process(self, batch: ScheduledBatch, logits) -> list[ReqOutput]:
        sampling, sample_rows, pos = [], [], 0  # logits rows: per request, prompt rows then its sample row
        for req, rows, sample, start in zip(batch.reqs, batch.prompt_rows, batch.samples, batch.starts):
            if rows:
                self._record_prompt_logprobs(req, logits[pos:pos + len(rows)], [start + r for r in rows])
                pos += len(rows)
            if sample:
                sampling.append(req)
                sample_rows.append(pos)
                pos += 1
        if pos != len(sample_rows):  # some rows were prompt log-probs: keep the sampling rows
            logits = logits[torch.tensor(sample_rows, dtype=torch.int64, device=logits.device)]
        wants = [i for i, r in enumerate(sampling) if r.logprob.return_logprob and r.params.max_new_tokens]
        raw = logits[wants].clone() if wants else None  # the model's own distribution, before sampling edits it
        self._apply_grammars(sampling, logits)
        rows = [SamplingRow(r.params, r.generator, r.output_ids, r.prompt_ids,
                            suppressed_ids(r, self.eos_ids)) for r in sampling]
        tokens = self.sampler.sample(logits, rows) if sampling else []
        if wants:
            top_n = max(sampling[i].logprob.top_n for i in wants)
            lps, tops = token_logprobs(raw, [tokens[i] for i in wants], top_n)
            for k, i in enumerate(wants):
                state, n = sampling[i].logprobs, sampling[i].logprob.top_n
                state.output.append(lps[k])
                if n:
                    state.output_top.append(tops[k][:n])
        outputs = []
        now = time.perf_counter()
        for req, token in zip(sampling, tokens):
            if req.params.max_new_tokens == 0:
                self._finish(req, {"type": "length", "length": 0})
            else:
                req.output_ids.append(token)
                req.first_token_time = req.first_token_time or now
                self.stats.generated_tokens += 1
                reason = finish_reason(req, self.eos_ids, self.runner.context_length, self.decoder)
                if req.grammar is not None:
                    reason = self._advance_grammar(req, token, reason)
                if reason is not None:
                    self._finish(req, reason)
            outputs.append(self._output(req))
        for req in batch.reqs[batch.num_decode:]:  # share computed prompts with later requests
            if req.status is ReqStatus.RUNNING:
                match = self.cache.cache_unfinished(req.seq_ids[: req.kv_len], req.seq,
                                                    req.last_node, req.namespace)
                req.last_node = match.last_node
                self.req_table.write(req.row, 0, req.seq.slots(0, len(match.pages) * self.page_size))
        return outputs

    def _apply_grammars(self, sampling: list[Req], logits: torch.Tensor) -> None:
        """Mask the logits (N, V) of constrained rows to the tokens their grammar allows next.

        Masks are filled on this thread after the forward: at about 3-20 µs a row they cost
        well under 1 % of a CPU forward, so overlapping them with it would not pay here."""
        rows = [i for i, r in enumerate(sampling) if r.grammar is not None and r.params.max_new_tokens]
        if not rows:
            return
        start = time.perf_counter()
        grammars = self.grammar_compiler()
        mask = grammars.allocate_mask(len(sampling))  # (N, ceil(V / 32)) int32 bits
        for i in rows:
            sampling[i].grammar.fill_mask(mask, i)
        grammars.apply_mask(logits, mask, rows)
        self.stats.grammar_mask_seconds += time.perf_counter() - start

    def _advance_grammar(self, req: Req, token: int, reason: dict[str, Any] | None) -> dict[str, Any] | None:
        """Accept the sampled token; then append whatever text the grammar forces (jump-forward),
        checking the stop rules after each forced token. Returns why the request ends, if it does."""
        if not req.grammar.accept(token):  # cannot happen under the mask; never crash the batch
            logger.error("request %s: token %d rejected by its grammar", req.rid, token)
            return {"type": "abort", "message": "the output left its grammar"}
        if req.grammar.terminated and reason is None:  # it took its stop token: done, min_new_tokens or not
            return {"type": "stop", "matched": token}
        if reason is not None or not req.params.jump_forward or req.logprob.return_logprob:
            return reason
        limit = min(req.remaining_new_tokens, self.runner.context_length - req.seq_len)
        for forced in req.grammar.jump_forward(token, limit):
            req.output_ids.append(forced)
            self.stats.jump_forward_tokens += 1
            reason = finish_reason(req, self.eos_ids, self.runner.context_length, self.decoder)
            if reason is not None:
                return reason
        return None

    def _record_prompt_logprobs(self, req: Req, logits, positions: list[int]) -> None:
        """logits (n, V) at `positions` score the prompt tokens one position later."""
        lps, tops = token_logprobs(logits, [req.prompt_ids[p + 1] for p in positions], req.logprob.top_n)
        for k, p in enumerate(positions):
            req.logprobs.prompt[p + 1] = (lps[k], tops[k] if tops else None)

    # -- memory ----------------------------------------------------------------------------------
    def _chunk_cap(self, seq_len: int) -> int:
        return self.config.chunked_prefill_size or seq_len

    def _chunk(self, req: Req) -> int:
        return min(req.seq_len - req.kv_len, self._chunk_cap(req.seq_len))

    def _grow(self, req: Req, n: int) -> tuple[Req, int, list[int], list[int]]:
        """Give `req` KV slots for its next `n` tokens (pages must be free).

        Returns (req, first position, the n tokens, their slots)."""
        start = req.kv_len
        slots = req.seq.extend(n)
        self.req_table.write(req.row, start, slots)
        req.kv_len += n
        return req, start, req.tokens(start, start + n), slots

    def _decode_reserve(self) -> int:
        """Pages kept free for the next `retract_decode_steps` decode steps of running requests."""
        horizon = self.config.retract_decode_steps
        return sum(r.seq.pages_needed(min(r.remaining_new_tokens, horizon)) for r in self.running)

    def _reserve(self, pages: int) -> bool:
        """Make `pages` free, evicting unlocked cache leaves if needed; whether it worked.

        Evicts nothing when even evicting everything evictable would not make enough room."""
        short = pages - self.allocator.free_pages
        if short <= 0:
            return True
        if short > self.cache.evictable_tokens // self.page_size:
            return False
        self.cache.evict(short * self.page_size)
        return self.allocator.free_pages >= pages

    def _release(self, req: Req) -> None:
        """Cache what `req` computed, unlock its path, return its pages and row."""
        self.cache.cache_finished(req.seq_ids[: req.kv_len], req.seq, req.last_node, req.namespace)
        self.req_table.free(req.row)
        req.seq, req.row, req.last_node, req.kv_len = None, None, None, 0
        self.running.remove(req)

    def _retract(self, req: Req) -> None:
        logger.info("retracting %s (%d tokens) to free KV pages", req.rid, req.kv_len)
        self._release(req)
        req.status = ReqStatus.WAITING
        req.retractions += 1
        self.stats.retractions += 1
        self.waiting.appendleft(req)

    def _finish(self, req: Req, reason: dict[str, Any]) -> None:
        if req.status is ReqStatus.RUNNING:
            self._release(req)
        req.status, req.finish_reason = ReqStatus.FINISHED, reason
        req.finish_time = time.perf_counter()
        self.stats.finished_requests += 1
        del self.reqs[req.rid]

    def _output(self, req: Req, error: str | None = None, error_kind: ErrorKind | None = None) -> ReqOutput:
        """What `req` produced since its last output (new tokens only) and where it stands."""
        first = req.sent_tokens
        new_ids = req.output_ids[first:]
        req.sent_tokens = len(req.output_ids)
        lp = req.logprobs
        out_lp = out_top = in_lp = in_top = None
        if req.logprob.return_logprob:
            out_lp = lp.output[first:]
            out_top = lp.output_top[first:] if req.logprob.top_n else None
            done = bool(req.output_ids) or req.status is ReqStatus.FINISHED
            if req.logprob.wants_prompt and not lp.prompt_sent and done:
                lp.prompt_sent = True
                span = range(req.logprob.start, len(req.prompt_ids))
                in_lp = [[lp.prompt.get(p, (None, None))[0], req.prompt_ids[p]] for p in span]
                if req.logprob.top_n:
                    in_top = [lp.prompt.get(p, (None, None))[1] for p in span]
        return ReqOutput(
            output_logprobs=out_lp, output_top_logprobs=out_top, input_logprobs=in_lp,
            input_top_logprobs=in_top,
            rid=req.rid, new_ids=new_ids, finished=req.status is ReqStatus.FINISHED,
            finish_reason=req.finish_reason, prompt_tokens=len(req.prompt_ids),
            cached_tokens=req.cached_tokens, completion_tokens=len(req.output_ids),
            ttft=None if req.first_token_time is None else req.first_token_time - req.arrival_time,
            latency=None if req.finish_time is None else req.finish_time - req.arrival_time,
            error=error, error_kind=error_kind,
        )

    # -- cache control and checks ----------------------------------------------------------------
    def flush_cache(self) -> bool:
        """Drop every cached prefix; refused (False) while requests are queued or running."""
        if self.has_work:
            return False
        self.cache.reset()
        return True

    def check_invariants(self) -> None:
        """Pool, tree and requests agree: every page is free, cached or held by a running request.

        Raises `CacheInvariantError` (never a bare assert, which `python -O` would drop)."""
        cached = self.cache.cached_pages()
        inflight = set()
        try:
            for req in self.running:
                req.check()
                inflight.update(p for p in req.seq.pages if p not in cached)
            for req in self.waiting:
                req.check()
        except AssertionError as e:
            raise CacheInvariantError(f"request state: {e}") from e
        self.cache.check_invariants(inflight_pages=len(inflight))
        if not self.has_work:
            if self.cache.protected_tokens:
                raise CacheInvariantError("a lock outlived its request")
            if self.allocator.free_tokens + self.cache.evictable_tokens != self.allocator.total_tokens:
                raise CacheInvariantError("idle, yet some pages are neither free nor evictable")

    def get_stats(self) -> dict[str, Any]:
        a = self.allocator
        return self.stats.to_dict() | {
            "waiting_requests": len(self.waiting),
            "running_requests": len(self.running),
            "total_tokens": a.total_tokens,
            "free_tokens": a.free_tokens,
            "used_tokens": a.total_tokens - a.free_tokens,
            "token_usage": (a.total_tokens - a.free_tokens) / a.total_tokens,
            "evictable_tokens": self.cache.evictable_tokens,
            "protected_tokens": self.cache.protected_tokens,
            "cached_tokens_in_tree": self.cache.total_tokens,
            "evicted_tokens": self.cache.stats_evicted_tokens,
        } | self._host_stats() | self.runner.parallel_stats()

    def _host_stats(self) -> dict[str, Any]:
        host = self.memory.host
        if host is None or self.config.disable_radix_cache:
            return {"host_total_tokens": 0}
        a = host.allocator
        return {"host_total_tokens": a.total_tokens, "host_used_tokens": a.total_tokens - a.free_tokens,
                "host_saved_tokens": host.saved_tokens, "host_loaded_tokens": host.loaded_tokens,
                "host_evicted_tokens": self.cache.stats_host_evicted_tokens}
