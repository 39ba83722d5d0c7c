"""EngineCore: the composition root of one engine, and its step.

It builds everything one engine runs on from one `EngineConfig`: the model runner and its KV
memory, the prefix cache (with its storage tier and prefetcher), the speculative proposer, the
scheduler over them, the executor (forward + sampling), the grammar service (on the first
constrained request) and the telemetry (stats, timeline, trace recorder, KV events). Then one
step reads top to bottom:

    receive   compiled grammars: their requests join the queue
    schedule  `out = scheduler.schedule()`        which requests run, how many tokens, which slots
    execute   `result = executor.execute(out)`    the forward and the sampler
    update    `scheduler.update(out, result)`     tokens appended, stop rules, finish, cache
    emit      one output per request that produced something (`SchedulerLoop` delivers them)

This is the one place where step N+1's scheduling could overlap step N's forward.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

from radixkv.config import EngineConfig
from radixkv.constrained import Compiled, Refused
from radixkv.core.executor import Executor
from radixkv.core.sampling import Sampling
from radixkv.errors import ErrorKind, InvalidRequestError, LoRAInUse
from radixkv.mem import make_cache_manager
from radixkv.model.runner import ModelRunner
from radixkv.model.sampler import Sampler
from radixkv.outputs import ReqOutput
from radixkv.sched.prefetch import Prefetcher
from radixkv.sched.records import ModelOutput, ScheduleOutput
from radixkv.sched.request import Req
from radixkv.sched.scheduler import Scheduler
from radixkv.sched.speculative import make_proposer
from radixkv.sched.stats import SchedulerStats
from radixkv.sched.timeline import open_timeline
from radixkv.sched.trace_recorder import open_recorder
from radixkv.tenancy import lora_namespace
from radixkv.tp.launch import load_runner
from radixkv.validation import RequestLimits

if TYPE_CHECKING:
    from radixkv.sched.kv_events import KVEventPublisher
    from radixkv.tokenizer import Tokenizer

logger = logging.getLogger(__name__)
GRAMMAR_WAIT_SECONDS = 0.005  # an idle step with grammars compiling waits this long for them


class EngineCore:
    """One engine's runner, cache, scheduler, executor, grammar service and telemetry.

    Not thread-safe: one caller drives `add_request`, `step` and `abort` (in the Engine and the
    server, that is `SchedulerLoop`), except `validate`."""

    def __init__(self, config: EngineConfig, runner: ModelRunner, tokenizer: Tokenizer | None = None):
        self.config = config
        self.runner = runner
        self.memory = runner.memory
        self.tokenizer = tokenizer
        self.page_size = config.cache.page_size
        self.allocator = self.memory.allocator
        eos = tokenizer.eos_token_ids if tokenizer else frozenset()
        self.eos_ids = frozenset(eos) | frozenset(runner.model_config.eos_token_ids)
        self.cache = make_cache_manager(config, self.memory, runner.model_config.attention_scale, runner.model_dir)
        self.stats = SchedulerStats()
        prefetcher = Prefetcher(self.cache, config.storage.kv_storage_prefetch_policy,
                                config.storage.kv_storage_prefetch_timeout,
                                self.stats.prefill_rate) if self.cache.reads_storage else None
        self.cache.track_evicted()  # remember evicted pages, to tell an evicted prefix from a new one
        self.proposer = self._proposer(config)
        self.transfers = self._transfers(config)
        self.scheduler = Scheduler(config, self.memory, self.cache, self.limits, self.eos_ids, tokenizer,
                                   self.proposer, prefetcher, self.stats, self.transfers)
        sampling = Sampling(Sampler(runner.device, config.scheduler.random_seed), self.eos_ids,
                            runner.model_config.vocab_size, self.stats)
        self.executor = Executor(runner, sampling)
        self._grammars = None  # GrammarService, started by the first constrained request
        self.timeline = open_timeline(config.telemetry.timeline_file)
        self.recorder = open_recorder(config.telemetry.record_trace, config.telemetry.record_trace_block_size,
                                      self.adapter_name)
        if self.recorder is not None:
            self.scheduler.on_accept.append(self.recorder.arrived)
        for telemetry in (self.timeline, self.recorder):
            if telemetry is not None:
                self.scheduler.on_finish.append(telemetry.finished)
        self.kv_events = self._kv_event_publisher(config)
        self.adapter_use: dict[str, list[int]] = {}  # LoRA adapter id -> [requests, prompt tokens, cached tokens]
        if config.lora.enabled:
            self.scheduler.on_finish.append(self._count_adapter_use)

    @classmethod
    def load(cls, config: EngineConfig, progress: bool = True) -> EngineCore:
        """The model runner, its KV memory and tokenizer (for stop strings), and everything over
        them, from one `EngineConfig`; `tokenizer` is None for a bare checkpoint."""
        from radixkv.tokenizer import Tokenizer

        runner = load_runner(config, progress=progress)
        try:
            return cls(config, runner, Tokenizer.from_model_dir(runner.model_dir))
        except BaseException:
            runner.close()  # the other tensor-parallel ranks, if any
            raise

    def _proposer(self, config: EngineConfig):
        """The draft proposer `speculative_algorithm` names, or None (speculation off)."""
        name = config.spec.speculative_algorithm
        if name is None:
            return None
        if name == "draft":
            from radixkv.sched.draft_model import DraftModelProposer

            return DraftModelProposer.load(config, self.runner)
        return make_proposer(name, self.cache)

    def _transfers(self, config: EngineConfig):
        """This server's side of a prefill/decode pair (`radixkv.disagg.sides`), or None."""
        if not config.disagg.enabled:
            return None
        from radixkv.disagg.sides import open_side

        def reserve(pages: int) -> bool:
            return self.scheduler.kv.reserve(pages)

        return open_side(config, self.memory, self.cache, reserve, self.runner.model_dir)

    def _kv_event_publisher(self, config: EngineConfig) -> KVEventPublisher | None:
        """The KV event publisher `kv_events_config` asks for, with the cache recording for it;
        None when off (the cache then records nothing)."""
        if not config.telemetry.kv_events.enabled:
            return None
        from radixkv.sched.kv_events import KVEventPublisher

        publisher = KVEventPublisher(config.telemetry.kv_events, self.page_size)
        self.cache.record_events()
        return publisher

    # -- requests in and out ---------------------------------------------------------------------
    def add_request(self, req: Req) -> None:
        """Check and queue; raises `InvalidRequestError` and changes nothing if `req` is bad.

        A constrained request waits apart while its grammar compiles (off this loop)."""
        self.scheduler.check(req)
        if req.lora is not None:
            self._check_adapter(req)
            req.namespace = lora_namespace(req.namespace, req.lora)  # each adapter caches apart
        self.scheduler.prepare(req)
        spec = req.params.grammar
        compiling = False
        if spec is not None:
            grammars = self.grammar_compiler()
            known = grammars.result(spec)
            if isinstance(known, Refused):
                raise InvalidRequestError(known.message)
            if known is None:
                grammars.submit(spec)
                compiling = True
            else:
                req.grammar = grammars.matcher(known)
        self.scheduler.accept(req, grammar_compiling=compiling)

    def _check_adapter(self, req: Req) -> None:
        lora = self.runner.lora
        if lora is None:
            raise InvalidRequestError("lora_path: this server serves no LoRA adapters (start it with --enable-lora)")
        if lora.by_id(req.lora) is None:
            raise InvalidRequestError(f"lora_path: adapter {req.lora!r} is not loaded (it was unloaded); loaded: "
                                      f"{sorted(lora.adapters)}")

    # -- LoRA adapters at run time (POST /load_lora_adapter, /unload_lora_adapter) ----------------
    def load_lora(self, name: str, path: str) -> dict[str, str]:
        """Load a PEFT adapter as `name`; raises `LoRAError` naming what is wrong (nothing changes)."""
        lora = self._lora_manager()
        lora.load(name, path)
        return lora.listing()

    def unload_lora(self, name: str) -> dict[str, str]:
        """Unload adapter `name`; refused while requests run or wait under it (they keep running)."""
        lora = self._lora_manager()
        adapter = lora.adapters.get(name)
        if adapter is not None:
            users = [r for r in self.scheduler.reqs.values() if r.lora == adapter.id]
            shared = [a for a in lora.adapters.values() if a.id == adapter.id and a.name != name]
            if users and not shared:
                raise LoRAInUse(f"lora_name={name!r}: {len(users)} request(s) run or wait under this adapter; "
                                "unload it when they are done")
        lora.unload(name)
        return lora.listing()

    def _count_adapter_use(self, req: Req) -> None:
        if req.lora is not None:
            use = self.adapter_use.setdefault(req.lora, [0, 0, 0])
            use[0], use[1], use[2] = use[0] + 1, use[1] + len(req.prompt_ids), use[2] + req.cached_tokens

    def adapter_stats(self) -> dict[str, Any]:
        """Per LoRA adapter (by name; an unloaded one by its id): requests, prompt tokens, cached
        tokens and hit rate since start -- each adapter's cache is its own."""
        names = {aid: name for name, aid in self.lora_adapters().items()}
        return {"lora_adapters": [{"name": names.get(aid, f"(unloaded {aid})"), "id": aid, "requests": n,
                                   "prompt_tokens": prompt, "cached_tokens": cached,
                                   "hit_rate": cached / prompt if prompt else 0.0}
                                  for aid, (n, prompt, cached) in self.adapter_use.items()]}

    def adapter_name(self, adapter_id: str) -> str:
        """A LoRA adapter's name (the first loaded under this id), or its id once unloaded."""
        return next((name for name, aid in self.lora_adapters().items() if aid == adapter_id), adapter_id)

    def lora_adapters(self) -> dict[str, str]:
        """name -> id of every loaded adapter ({} without LoRA)."""
        return self.runner.lora.listing() if self.runner.lora is not None else {}

    def _lora_manager(self):
        if self.runner.lora is None:
            raise InvalidRequestError("this server serves no LoRA adapters (start it with --enable-lora)")
        return self.runner.lora

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
                             self.allocator.total_tokens, self.page_size, self.tokenizer is not None)

    def validate(self, req: Req) -> None:
        """Whether `req` could ever run here (`Scheduler.validate`: safe from any thread)."""
        self.scheduler.validate(req)

    def abort(self, rid: str, message: str = "aborted by request", error_kind: ErrorKind | None = None
              ) -> ReqOutput | None:
        """`Scheduler.abort`: stop `rid` wherever it is; None if unknown or finished."""
        return self.scheduler.abort(rid, message, error_kind)

    @property
    def has_work(self) -> bool:
        return self.scheduler.has_work

    # -- the step --------------------------------------------------------------------------------
    def step(self) -> list[ReqOutput]:
        """One forward over a mixed batch: a decode token for every decoding request plus
        prefill chunks of admitted requests (see the module docstring).

        If the forward fails, the scheduler rolls its batch back and ends its requests with an
        error output; the other requests keep running."""
        start = time.perf_counter()
        outputs = self._receive_grammars() + self.scheduler.poll_transfers()
        out = self.scheduler.schedule()
        if not out.rows:
            if self.scheduler.only_compiling:
                outputs += self._receive_grammars(GRAMMAR_WAIT_SECONDS)
            return outputs + out.finished
        try:
            result = self.executor.execute(out)
        except BaseException:  # interrupted: nothing of this batch may reach the cache
            self.scheduler.rollback(out)
            raise
        outputs += self.scheduler.update(out, result)
        if result.error is None:
            self._record_step(out, result, start)
            if self.config.telemetry.log_level == "debug":
                self.check_invariants()
        return outputs

    def _receive_grammars(self, wait: float = 0.0) -> list[ReqOutput]:
        """Requests whose grammar is now compiled join the queue; refused ones end with an error."""
        if self._grammars is None or not self.scheduler.grammar_waiting:
            return []
        outputs = []
        for spec, result in self._grammars.poll(wait):
            if isinstance(result, Compiled):
                self.scheduler.grammar_compiled(spec, lambda compiled=result: self._grammars.matcher(compiled))
            else:
                outputs += self.scheduler.grammar_refused(spec, result.message, result.kind)
        return outputs

    def _record_step(self, out: ScheduleOutput, result: ModelOutput, start: float) -> None:
        seconds = time.perf_counter() - start
        self.stats.record_step(out.num_decode, out.num_prefill_tokens, seconds, result.forward_seconds)
        if self.timeline is not None:
            self.timeline.step(result.forward_start, result.forward_seconds, seconds, out.num_decode,
                               out.num_prefill_tokens, [r.rid for r in out.reqs])

    # -- cache control, checks and stats ---------------------------------------------------------
    def publish_kv_events(self) -> None:
        """Hand the cache's page changes since the last call to the KV event publisher, as one
        batch (the loop calls this once per iteration; nothing when publishing is off)."""
        if self.kv_events is not None:
            events = self.cache.take_events()
            if events:
                self.kv_events.publish(events)

    def flush_cache(self) -> bool:
        """Drop every cached prefix; refused (False) while requests are queued or running."""
        return self.scheduler.flush_cache()

    def check_invariants(self) -> None:
        """Pool, tree and requests agree (`Scheduler.check_invariants`)."""
        self.scheduler.check_invariants()

    def get_stats(self) -> dict[str, Any]:
        return self.scheduler.get_stats() | self.cache.host_stats() | self.cache.storage_stats() | self.runner.parallel_stats() | self.runner.compile_stats() | self.runner.moe_stats() | (
            self.kv_events.stats() if self.kv_events is not None else {}) | (
            self.adapter_stats() if self.runner.lora is not None else {})

    def close(self) -> None:
        """Stop the grammar compiler, the KV event publisher (after its last batch), the storage
        tier's threads (after its writes in flight) and the other tensor-parallel ranks, if any.
        The recorded trace and the timeline are written first: a slow storage flush must not
        lose them to a process killed while it waits."""
        if self.recorder is not None:
            self.recorder.close()
        if self.timeline is not None:
            self.timeline.close()
        if self.transfers is not None:  # before the cache: its locks and pages go back first
            self.transfers.close()
        self.cache.close()  # the storage tier persists what the device and host tiers hold, then stops
        if self.kv_events is not None:
            self.publish_kv_events()
            self.kv_events.close()
        if self._grammars is not None:
            self._grammars.close()
        if hasattr(self.proposer, "close"):
            self.proposer.close()
        self.runner.close()
