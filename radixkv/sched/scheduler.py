"""The scheduler: continuous batching over the radix cache.

One request's life, top to bottom (each step's details live in their own module):
  add_request  -> validated; its grammar, if any, compiled off this loop    (constrained)
               -> queued (WAITING)
  step         -> receive  compiled grammars: their requests join the queue
                  admit    decode rows, then prefill chunks: match prefix, lock it, reserve
                           pages, write req_to_token                         (admission, kv)
                  run      one forward: store K/V, attention, logits          (model runner)
                  sample   prompt log-probs, masks, tokens, stop rules        (postprocess)
                  cache    each extend's computed prompt goes into the tree; a finished
                           request's prompt + output too, then its lock, pages and row go back
                  emit     one output per request that produced something    (ReqOutput)
  publish_kv_events -> the tree's page changes of the step, one batch (--kv-events-config)
Under memory pressure admission evicts, decode evicts then retracts running requests (their
KV goes into the tree, they re-queue at the front); nothing fails for lack of pages alone.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from typing import TYPE_CHECKING, Any

from radixkv.config import EngineConfig
from radixkv.constrained import Compiled, Refused
from radixkv.errors import ErrorKind, InvalidRequestError
from radixkv.grammar_spec import GrammarSpec
from radixkv.mem import KVMemory, make_prefix_cache
from radixkv.mem.cache_events import CacheEventLog
from radixkv.mem.miss_causes import GhostIndex, explain, retokenized
from radixkv.model.runner import ModelRunner
from radixkv.model.sampler import Sampler
from radixkv.outputs import ReqOutput
from radixkv.sched.admission import Admission
from radixkv.sched.batch import ScheduledBatch
from radixkv.sched.kv import RequestKV
from radixkv.sched.policy import SchedulePolicy, match_key
from radixkv.sched.postprocess import PostProcessor
from radixkv.sched.prefetch import Prefetcher, open_storage
from radixkv.sched.request import Req, ReqStatus
from radixkv.sched.speculative import DraftLength, make_proposer
from radixkv.sched.stats import SchedulerStats
from radixkv.sched.stop import Decoder
from radixkv.sched.timeline import open_timeline
from radixkv.sched.trace_recorder import open_recorder
from radixkv.tp.launch import load_runner
from radixkv.validation import RequestLimits, check_request

if TYPE_CHECKING:
    from radixkv.sched.kv_events import KVEventPublisher

logger = logging.getLogger(__name__)
GRAMMAR_WAIT_SECONDS = 0.005  # an idle step with grammars compiling waits this long for them


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
        self.page_size = config.cache.page_size
        self.allocator = memory.allocator
        storage, identity = self._storage(config, runner, memory)
        self.cache = make_prefix_cache(self.allocator, config.cache.eviction_policy, runner.model_config.attention_scale,
                                       host_tier=memory.host, disabled=config.cache.disable_radix_cache,
                                       storage=storage, identity=identity)
        self.prefetcher = Prefetcher(self.cache, config.storage.kv_storage_prefetch_policy,
                                     config.storage.kv_storage_prefetch_timeout) if storage is not None else None
        self.waiting: deque[Req] = deque()
        self.running: list[Req] = []
        self.reqs: dict[str, Req] = {}
        self.grammar_waiting: dict[GrammarSpec, list[Req]] = {}  # requests whose grammar is compiling
        self.stats = SchedulerStats()
        self.policy = SchedulePolicy(config.scheduler.schedule_policy, self.cache, config.scheduler.starvation_limit)
        self.kv = RequestKV(memory, self.cache, config.scheduler.retract_decode_steps)
        self.proposer = self._proposer(config)
        if hasattr(self.cache, "root"):  # remember evicted pages, to tell an evicted prefix from a new one
            self.cache.ghosts = GhostIndex()
        self.admission = Admission(config, self.kv, self.policy, self.stats, self.waiting, self.running,
                                   self.proposer, runner.context_length, self.prefetcher, self._explain)
        self.post = PostProcessor(Sampler(runner.device, config.scheduler.random_seed), self.eos_ids, runner.context_length,
                                  decoder, runner.model_config.vocab_size, self.stats)
        self._grammars = None  # GrammarService, started by the first constrained request
        self.timeline = open_timeline(config.telemetry.timeline_file)
        self.recorder = open_recorder(config.telemetry.record_trace, config.telemetry.record_trace_block_size)
        self.kv_events = self._kv_event_publisher(config)

    def _explain(self, req: Req) -> dict[str, int]:
        """`req`'s prompt by cause, at its first admission (see `radixkv.mem.miss_causes`). The
        tokens a cache may never serve (the last, which runs for its logits, and those whose
        prompt log-probs were asked for) count as `page_tail`: cached or not, they run."""
        key = match_key(req)
        device = req.cached_tokens - req.host_hit_tokens - req.storage_hit_tokens
        causes = explain(self.cache, key, req.namespace, device, req.host_hit_tokens, req.storage_hit_tokens)
        if self.tokenizer is not None:
            causes = retokenized(self.cache, key, req.namespace, causes, self.tokenizer.decode)
        causes["page_tail"] += len(req.prompt_ids) - len(key)
        return causes

    @staticmethod
    def _storage(config: EngineConfig, runner: ModelRunner, memory: KVMemory):
        """(the storage tier `--kv-storage-dir` asks for, its key identity), or (None, b"")."""
        if config.storage.kv_storage_dir is None or memory.host is None or config.cache.disable_radix_cache:
            return None, b""
        return open_storage(config, runner.model_dir, memory)

    def _proposer(self, config: EngineConfig):
        """The draft proposer `speculative_algorithm` names, or None (speculation off)."""
        name = config.spec.speculative_algorithm
        if name is None:
            return None
        if name == "draft":
            from radixkv.sched.draft_model import DraftModelProposer

            return DraftModelProposer.load(config, self.runner)
        return make_proposer(name, self.cache)

    def _kv_event_publisher(self, config: EngineConfig) -> KVEventPublisher | None:
        """The KV event publisher `kv_events_config` asks for, with the cache recording for it;
        None when off (the cache then records nothing)."""
        if not config.telemetry.kv_events.enabled:
            return None
        from radixkv.sched.kv_events import KVEventPublisher

        publisher = KVEventPublisher(config.telemetry.kv_events, self.page_size)
        self.cache.events = CacheEventLog(self.page_size)
        return publisher

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
        """Validate and queue; raises `InvalidRequestError` and changes nothing if `req` is bad.

        A constrained request waits apart while its grammar compiles (off this loop)."""
        if req.rid in self.reqs:
            raise InvalidRequestError(f"request id {req.rid!r} is already in use")
        self.validate(req)
        if req.retention is not None:  # --max-cache-retention caps every hint (0: none is kept)
            req.retention = req.retention.capped(self.config.cache.max_cache_retention) or None
        if self.proposer is not None:
            req.spec = DraftLength.start(self.config.spec.speculative_num_draft_tokens, self.stats.spec_recent_rate)
        spec = req.params.grammar
        if spec is not None:
            grammars = self.grammar_compiler()
            known = grammars.result(spec)
            if isinstance(known, Refused):
                raise InvalidRequestError(known.message)
            if known is None:
                grammars.submit(spec)
                self.grammar_waiting.setdefault(spec, []).append(req)
                self._accept(req)
                return
            req.grammar = grammars.matcher(known)
        self._accept(req)
        self._queue(req)

    def _accept(self, req: Req) -> None:
        """`req` passed its checks: it is the scheduler's until `_finish`."""
        self.reqs[req.rid] = req
        if self.recorder is not None:
            self.recorder.arrived(req)

    def _queue(self, req: Req) -> None:
        if req.params.seed is not None:
            req.generator = Sampler.request_generator(req.params.seed, self.runner.device)
        self.waiting.append(req)

    def grammar_compiler(self):
        """The `GrammarService` compiling this model's grammars (started on first use)."""
        if self._grammars is None:
            if self.tokenizer is None:
                raise InvalidRequestError("constrained decoding needs the model's tokenizer, which this "
                                          "checkpoint lacks")
            from radixkv.constrained import GrammarBudget, GrammarService

            budget = GrammarBudget(self.config.grammar.grammar_compile_timeout, self.config.grammar.grammar_compile_memory_bytes)
            self._grammars = GrammarService(self.runner.model_dir, self.tokenizer.hf,
                                            self.runner.model_config.vocab_size, self.eos_ids, budget)
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
        if req in self.waiting:
            self.waiting.remove(req)
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
        return bool(self.waiting or self.running or self.grammar_waiting)

    # -- the loop --------------------------------------------------------------------------------
    def step(self) -> list[ReqOutput]:
        """Run one forward over a mixed batch: a decode token for every decoding request plus
        prefill chunks of admitted requests.

        If the forward raises, the batch's new KV slots are rolled back (so nothing that was
        never computed can reach the cache) and its requests end with an error output; the
        other requests keep running.
        """
        start = time.perf_counter()
        outputs = self._receive_grammars()
        if self.prefetcher is not None:
            self.prefetcher.poll(self.waiting)
        schedule = self.admission.schedule()
        if schedule is None:
            return outputs + self._idle()
        batch = ScheduledBatch.build(schedule.rows, schedule.num_decode, self.runner.device)
        forward_start = time.perf_counter()
        try:
            logits = self.runner.forward(batch.forward)  # (N, V): the rows batch.layout names
        except Exception as e:
            logger.exception("model forward failed; ending the %d request(s) of its batch", len(batch.rows))
            self._rollback(batch)
            return outputs + self._fail(batch.reqs, f"the model forward failed: {type(e).__name__}: {e}")
        except BaseException:
            self._rollback(batch)
            raise
        forward_time = time.perf_counter() - forward_start
        for sampled in self.post.process(batch, logits):
            if sampled.rejected:  # drafts it did not keep: their KV goes before anything is cached
                self.kv.rollback(sampled.req, sampled.rejected)
            if sampled.finish is not None:
                self._finish(sampled.req, sampled.finish)
            outputs.append(sampled.req.take_output())
        for row in batch.rows[batch.num_decode:]:  # share computed prompts with later requests
            if row.req.status is ReqStatus.RUNNING:
                self.kv.cache_chunk(row.req)
        seconds = time.perf_counter() - start
        self.stats.record_step(batch.num_decode, batch.num_prefill_tokens, seconds, forward_time)
        if self.timeline is not None:
            self.timeline.step(forward_start, forward_time, seconds, batch.num_decode, batch.num_prefill_tokens,
                               [r.rid for r in batch.reqs])
        if self.config.telemetry.log_level == "debug":
            self.check_invariants()
        return outputs

    def _receive_grammars(self, wait: float = 0.0) -> list[ReqOutput]:
        """Requests whose grammar is now compiled join the queue; refused ones end with an error."""
        if self._grammars is None or not self.grammar_waiting:
            return []
        outputs = []
        for spec, result in self._grammars.poll(wait):
            for req in self.grammar_waiting.pop(spec, []):
                if isinstance(result, Compiled):
                    req.grammar = self._grammars.matcher(result)
                    self._queue(req)
                else:
                    self._finish(req, {"type": "abort", "message": result.message})
                    outputs.append(req.take_output(result.message, result.kind))
        return outputs

    def _idle(self) -> list[ReqOutput]:
        """Nothing can run: wait briefly for compiling grammars, or, if the queue head cannot
        start in an idle pool (validation should make that impossible), end it rather than spin."""
        if self.grammar_waiting and not self.waiting and not self.running:
            return self._receive_grammars(GRAMMAR_WAIT_SECONDS)
        if not self.waiting or self.running:
            return []
        if self.prefetcher is not None and self.prefetcher.pending:  # requests wait on storage reads
            self.prefetcher.wait(0.002)
            return []
        req = self.waiting.popleft()
        logger.error("request %s cannot be admitted into an idle pool; aborting it", req.rid)
        self._finish(req, {"type": "abort", "message": "cannot fit in the KV pool even when idle"})
        return [req.take_output()]

    def _fail(self, reqs: list[Req], message: str) -> list[ReqOutput]:
        outputs = []
        for req in reqs:
            if req.status is not ReqStatus.FINISHED:
                self._finish(req, {"type": "abort", "message": message})
                outputs.append(req.take_output(message, ErrorKind.INTERNAL))
        return outputs

    def _rollback(self, batch: ScheduledBatch) -> None:
        for row in batch.rows:
            if row.req.status is ReqStatus.RUNNING:
                self.kv.rollback(row.req, len(row.tokens))

    def _finish(self, req: Req, reason: dict[str, Any]) -> None:
        if self.prefetcher is not None:
            self.prefetcher.forget(req)
        if req.status is ReqStatus.RUNNING:
            self.kv.release(req)
            self.running.remove(req)
        req.status, req.finish_reason = ReqStatus.FINISHED, reason
        req.finish_time = time.perf_counter()
        self.stats.finished_requests += 1
        del self.reqs[req.rid]
        if self.timeline is not None:
            self.timeline.finished(req)
        if self.recorder is not None:
            self.recorder.finished(req)

    # -- cache control, checks and stats ---------------------------------------------------------
    def publish_kv_events(self) -> None:
        """Hand the cache's page changes since the last call to the KV event publisher, as one
        batch (the loop calls this once per iteration; nothing when publishing is off)."""
        if self.kv_events is not None:
            events = self.cache.events.take()
            if events:
                self.kv_events.publish(events)

    def flush_cache(self) -> bool:
        """Drop every cached prefix; refused (False) while requests are queued or running."""
        if self.has_work:
            return False
        self.kv.flush()
        return True

    def check_invariants(self) -> None:
        """Pool, tree and requests agree (`RequestKV.check`); raises `CacheInvariantError`."""
        compiling = [req for reqs in self.grammar_waiting.values() for req in reqs]
        self.kv.check(self.running, list(self.waiting) + compiling, idle=not self.has_work)

    def get_stats(self) -> dict[str, Any]:
        return self.stats.to_dict() | {
            "waiting_requests": len(self.waiting) + sum(map(len, self.grammar_waiting.values())),
            "running_requests": len(self.running),
            "max_cache_retention": self.config.cache.max_cache_retention,
        } | self.kv.stats() | self._host_stats() | self._storage_stats() | self.runner.parallel_stats() | self.runner.compile_stats() | self.runner.moe_stats() | (
            self.kv_events.stats() if self.kv_events is not None else {})

    def _host_stats(self) -> dict[str, Any]:
        host = self.memory.host
        if host is None or self.config.cache.disable_radix_cache:
            return {"host_total_tokens": 0}
        a = host.allocator
        return {"host_total_tokens": a.total_tokens, "host_used_tokens": a.total_tokens - a.free_tokens,
                "host_saved_tokens": host.saved_tokens, "host_loaded_tokens": host.loaded_tokens,
                "host_evicted_tokens": self.cache.stats_host_evicted_tokens}

    def _storage_stats(self) -> dict[str, Any]:
        storage = getattr(self.cache, "storage", None)
        if storage is None:
            return {"storage_enabled": False}
        return storage.stats() | {"storage_loaded_tokens": self.cache.stats_storage_loaded_tokens}

    def close(self) -> None:
        """Stop the grammar compiler, the KV event publisher (after its last batch), the storage
        tier's threads (after its writes in flight) and the other tensor-parallel ranks, if any.
        The recorded trace and the timeline are written first: a slow storage flush must not
        lose them to a process killed while it waits."""
        if self.recorder is not None:
            self.recorder.close()
        if self.timeline is not None:
            self.timeline.close()
        storage = getattr(self.cache, "storage", None)
        if storage is not None:
            pages = self.cache.persist()  # what the device and host tiers hold survives the restart
            storage.close()
            logger.info("KV storage: %d page(s) written at shutdown; %d page(s) stored in %s", pages,
                        storage.stored_pages, storage.directory)
        if self.kv_events is not None:
            self.publish_kv_events()
            self.kv_events.close()
        if self._grammars is not None:
            self._grammars.close()
        if hasattr(self.proposer, "close"):
            self.proposer.close()
        self.runner.close()
