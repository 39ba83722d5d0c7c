"""Engine: the offline, in-process API (an `EngineCore` + tokenizer, no HTTP).

    import radixkv
    with radixkv.Engine() as engine:                      # embedded default model
        out = engine.generate("The capital of France is", {"max_new_tokens": 16, "temperature": 0})
        outs = engine.generate(["a", "b"], {"max_new_tokens": 8})
        outs = engine.generate(input_ids=[[1, 2, 3]], sampling_params={"max_new_tokens": 4})

Each output is `{"text", "output_ids", "meta_info": {"id", "prompt_tokens", "cached_tokens",
"completion_tokens", "finish_reason", "ttft", "e2e_latency"}}`; with `return_logprob=True` the
meta_info also holds `output_token_logprobs` ([[logprob, token_id], ...]), with
`logprob_start_len >= 0` `input_token_logprobs` (the prompt from that position; the first
prompt token has no log-prob: None), and with `top_logprobs_num > 0` the `output_top_logprobs` /
`input_top_logprobs` alternatives.

Thread-safe: one loop (`SchedulerLoop`) drives the engine core and hands each output to the
caller waiting for that request, so any number of threads may generate, stream, abort, flush or
read stats at once, and streams may interleave. There is no background thread: a caller that is
waiting for an output and finds nobody driving runs the loop itself, one step at a time, so a
single-threaded program computes on its own thread (torch runs ~40 % slower when its forward
is launched from a secondary thread on this CPU's OpenMP runtime).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import astuple
from typing import Any

from radixkv.config import EngineConfig
from radixkv.core import EngineCore
from radixkv.core.loop import AbortRequest, AddRequest, CallCore, QueueInbox, SchedulerLoop, Stop
from radixkv.errors import EngineError, InvalidRequestError, RadixKVError
from radixkv.logs import setup_logging
from radixkv.sched import Req, ReqOutput
from radixkv.results import Collected
from radixkv.retention import Retention
from radixkv.sampling_params import LogprobParams, SamplingParams
from radixkv.tokenizer import TextStream, trim_stop_string

logger = logging.getLogger(__name__)
IDLE_WAIT_SECONDS = 0.01  # how long a caller that cannot drive waits before trying again


class Engine:
    """Offline generation with continuous batching over the radix prefix cache."""

    def __init__(self, model: str | None = None, *, progress: bool = True, **options: Any):
        self.config = EngineConfig.from_kwargs(model=model, **options)
        setup_logging(self.config.telemetry.log_level)
        self.core = EngineCore.load(self.config, progress=progress)
        self.runner = self.core.runner
        self.tokenizer = self.core.tokenizer
        self._inbox = QueueInbox()
        self._waiters: dict[str, queue.SimpleQueue[ReqOutput]] = {}  # rid -> its caller's queue
        self._lock = threading.Lock()  # guards _waiters and _closed
        self._driving = threading.Lock()  # held by the one thread running the loop
        self._dedicated_drivers = 0  # threads in run_until: they drive, everyone else waits
        self._closed = False
        self._loop = SchedulerLoop(self.core, self._deliver)

    # -- generation ------------------------------------------------------------------------------
    def generate(
        self,
        prompt: str | Sequence[str] | None = None,
        sampling_params: dict | SamplingParams | Sequence[dict | SamplingParams] | None = None,
        input_ids: Sequence[int] | Sequence[Sequence[int]] | None = None,
        namespace: Any = None,
        return_logprob: bool | Sequence[bool] = False,
        logprob_start_len: int | Sequence[int] = -1,
        top_logprobs_num: int | Sequence[int] = 0,
        retention: Retention | None = None,
    ) -> dict[str, Any] | list[dict[str, Any]]:
        """Generate for one prompt (returns a dict) or a batch (returns a list, in order).

        Every request is validated before any runs: a bad one raises `InvalidRequestError`
        naming its index and field, and the engine keeps serving. The log-prob arguments take
        one value for the batch or one per prompt. `retention` (for every prompt) asks the
        cache to keep their prefixes that long (`radixkv.retention`; capped at
        max_cache_retention).
        """
        reqs, single = self._make_requests(prompt, sampling_params, input_ids, namespace,
                                           (return_logprob, logprob_start_len, top_logprobs_num), retention)
        collected = {r.rid: Collected() for r in reqs}
        final: dict[str, ReqOutput] = {}
        inbox = self._submit(reqs)
        try:
            while len(final) < len(reqs):
                out = self._next(inbox)
                collected[out.rid].add(out)
                if out.finished:
                    self._raise_if_error(out, [r.rid for r in reqs], single)
                    final[out.rid] = out
        finally:
            self._withdraw(reqs, final)
        results = [self._result(req, collected[req.rid], final[req.rid]) for req in reqs]
        return results[0] if single else results

    def generate_stream(
        self,
        prompt: str | None = None,
        sampling_params: dict | SamplingParams | None = None,
        input_ids: Sequence[int] | None = None,
        namespace: Any = None,
        return_logprob: bool = False,
        logprob_start_len: int = -1,
        top_logprobs_num: int = 0,
        retention: Retention | None = None,
    ) -> Iterator[dict[str, Any]]:
        """Yield `{"text": delta, "output_ids": new ids, "finished": bool, "meta_info"}` chunks
        for one request as it decodes (log-probs, when asked for, are those of the chunk's
        tokens); closing the iterator early aborts the request, and `abort(id)` ends it with
        finish_reason "abort"."""
        if self.tokenizer is None:
            raise InvalidRequestError(f"{self.runner.model_dir} has no tokenizer to stream text with")
        reqs, single = self._make_requests(prompt, sampling_params, input_ids, namespace,
                                           (return_logprob, logprob_start_len, top_logprobs_num), retention)
        if not single:
            raise InvalidRequestError("generate_stream takes a single prompt")
        req = reqs[0]
        p = req.params
        text = TextStream(self.tokenizer, p.skip_special_tokens, p.stop, not p.no_stop_trim,
                          p.spaces_between_special_tokens)
        return self._stream(req, text)

    def _stream(self, req: Req, text: TextStream) -> Iterator[dict[str, Any]]:
        finished: dict[str, ReqOutput] = {}
        inbox = self._submit([req])
        try:
            while not finished:
                out = self._next(inbox)
                if out.finished:
                    self._raise_if_error(out, [req.rid], True)
                    finished[req.rid] = out
                    delta = text.finish(out.new_ids, out.finish_reason)
                else:
                    delta = text.push(out.new_ids)
                piece = Collected()
                piece.add(out)
                yield {"text": delta, "output_ids": out.new_ids, "finished": out.finished,
                       "meta_info": out.meta_info() | piece.logprob_meta(*astuple(req.logprob))}
        finally:
            self._withdraw([req], finished)

    def chat(self, messages: list[dict[str, Any]], sampling_params: dict | None = None, **kw) -> dict[str, Any]:
        """Generate the assistant's reply to `messages` through the model's chat template."""
        if self.tokenizer is None:
            raise InvalidRequestError(f"{self.runner.model_dir} has no tokenizer (and no chat template)")
        return self.generate(input_ids=self.tokenizer.apply_chat_template(messages),
                             sampling_params=sampling_params, **kw)

    def abort(self, rid: str) -> bool:
        """Stop request `rid`, returning everything it holds; whether it was in flight. Its
        caller gets what it produced so far, with finish_reason "abort"."""

        def abort(core: EngineCore) -> bool:
            out = core.abort(rid)
            if out is not None:
                self._deliver([out])
            return out is not None

        return self._call(abort)

    def run_until(self, done) -> None:
        """Drive the engine core on this thread until `done()` is true: for a thread that waits
        while others submit the work (torch computes fastest on a process's main thread, so
        `run_batch` of the frontend drives from there)."""
        with self._lock:
            self._dedicated_drivers += 1
        try:
            while not done():
                if not self._driving.acquire(timeout=IDLE_WAIT_SECONDS):
                    continue
                try:
                    self._check_open()
                    progressed = self._loop.run_once(self._inbox)
                finally:
                    self._driving.release()
                if not progressed:
                    time.sleep(0.001)  # idle: let the other threads submit
        finally:
            with self._lock:
                self._dedicated_drivers -= 1

    # -- control and stats -----------------------------------------------------------------------
    def flush_cache(self) -> bool:
        """Empty the prefix cache; False (nothing done) while requests are in flight."""
        return self._call(lambda core: core.flush_cache())

    def get_stats(self) -> dict[str, Any]:
        """Cache hit rate, token usage, free/evictable/protected tokens, queue lengths, counters."""
        return self._call(lambda core: core.get_stats())

    def check_invariants(self) -> None:
        self._call(lambda core: core.check_invariants())

    def shutdown(self) -> None:
        """Abort whatever is in flight (its callers get `EngineError`) and release the model and
        the KV pool."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        with self._driving:
            self._inbox.put(Stop())
            while self._loop.run_once(self._inbox) is not None:
                pass
        self.core.close()  # the grammar compiler and the other tensor-parallel ranks, if any
        del self.core, self.runner, self._loop

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.shutdown()

    # -- the loop and its callers ----------------------------------------------------------------
    def _deliver(self, outputs: list[ReqOutput]) -> None:
        with self._lock:
            for out in outputs:
                inbox = self._waiters.get(out.rid)
                if inbox is not None:  # nobody waits for a request its caller gave up on
                    inbox.put(out)

    def _submit(self, reqs: list[Req]) -> queue.SimpleQueue[ReqOutput]:
        """Register one queue for `reqs`' outputs (before any can arrive), then queue them."""
        inbox: queue.SimpleQueue[ReqOutput] = queue.SimpleQueue()
        with self._lock:
            self._check_open()
            for req in reqs:
                self._waiters[req.rid] = inbox
            for req in reqs:
                self._inbox.put(AddRequest(req))
        return inbox

    def _next(self, inbox: queue.SimpleQueue[ReqOutput]) -> ReqOutput:
        """The next output for this caller, driving the loop whenever nobody else does."""
        while True:
            try:
                return inbox.get_nowait()
            except queue.Empty:
                pass
            if not self._dedicated_drivers and self._driving.acquire(blocking=False):
                try:
                    if self._closed:
                        raise EngineError("this engine has been shut down")
                    progressed = self._loop.run_once(self._inbox)
                finally:
                    self._driving.release()
                if progressed:
                    continue
            try:  # another thread drives (or nothing is left to do): wait for an output
                return inbox.get(timeout=IDLE_WAIT_SECONDS)
            except queue.Empty:
                continue

    def _withdraw(self, reqs: list[Req], finished: dict[str, ReqOutput]) -> None:
        """Stop waiting for `reqs`; abort those not finished (an error, a closed stream)."""
        with self._lock:
            for req in reqs:
                self._waiters.pop(req.rid, None)
            if not self._closed:
                for req in reqs:
                    if req.rid not in finished:
                        self._inbox.put(AbortRequest(req.rid))

    def _call(self, fn):
        """Run `fn(core)` between two steps of the loop (after the commands sent before it)
        and return its result."""
        command = CallCore(fn)
        with self._lock:
            self._check_open()
            self._inbox.put(command)
        while not command.future.done():
            if self._driving.acquire(blocking=False):
                try:
                    self._loop.apply_pending(self._inbox)
                finally:
                    self._driving.release()
            else:
                try:  # whoever drives applies it between two steps
                    command.future.exception(timeout=IDLE_WAIT_SECONDS)
                except TimeoutError:
                    pass
        return command.future.result()

    def _check_open(self) -> None:
        if self._closed:
            raise EngineError("this engine has been shut down")

    @staticmethod
    def _raise_if_error(out: ReqOutput, rids: list[str], single: bool) -> None:
        try:
            out.raise_if_error()
        except RadixKVError as e:
            if single:
                raise
            raise type(e)(f"request [{rids.index(out.rid)}]: {e}") from None

    # -- helpers ---------------------------------------------------------------------------------
    def _make_requests(self, prompt, sampling_params, input_ids, namespace,
                       logprob_args=(False, -1, 0), retention: Retention | None = None) -> tuple[list[Req], bool]:
        self._check_open()
        if (prompt is None) == (input_ids is None):
            raise InvalidRequestError("give exactly one of prompt or input_ids")
        if prompt is not None:
            if self.tokenizer is None:
                raise InvalidRequestError(f"{self.runner.model_dir} has no tokenizer: pass input_ids")
            single = isinstance(prompt, str)
            if not single and not (isinstance(prompt, (list, tuple)) and all(isinstance(p, str) for p in prompt)):
                raise InvalidRequestError(f"prompt must be a string or a list of strings, got {type(prompt).__name__}")
            prompts = [prompt] if single else list(prompt)
            ids = [self.tokenizer.encode(p) for p in prompts]
        else:
            if not isinstance(input_ids, (list, tuple)):
                raise InvalidRequestError(f"input_ids must be a list of token ids (or of lists), "
                                          f"got {type(input_ids).__name__}")
            single = not input_ids or not isinstance(input_ids[0], (list, tuple))
            ids = [list(input_ids)] if single else [list(x) for x in input_ids]
        if not ids:
            raise InvalidRequestError("the batch is empty")
        if retention is not None and not isinstance(retention, Retention):
            raise InvalidRequestError(f"retention must be a radixkv.retention.Retention, got {type(retention).__name__}")
        if isinstance(sampling_params, (list, tuple)):
            if len(sampling_params) != len(ids):
                raise InvalidRequestError(f"{len(sampling_params)} sampling_params for {len(ids)} prompts")
            params_list = list(sampling_params)
        else:
            params_list = [sampling_params] * len(ids)
        namespaces = namespace if isinstance(namespace, list) else [namespace] * len(ids)
        if len(namespaces) != len(ids):
            raise InvalidRequestError(f"{len(namespaces)} namespaces for {len(ids)} prompts")
        for ns in namespaces:
            try:
                hash(ns)
            except TypeError:
                raise InvalidRequestError(f"namespace {ns!r} must be hashable (a string or number)") from None
        per_request = []
        for name, value in zip(("return_logprob", "logprob_start_len", "top_logprobs_num"), logprob_args):
            values = list(value) if isinstance(value, (list, tuple)) else [value] * len(ids)
            if len(values) != len(ids):
                raise InvalidRequestError(f"{len(values)} values of {name} for {len(ids)} prompts")
            per_request.append(values)
        reqs = []
        for i, (toks, params, ns, *lp) in enumerate(zip(ids, params_list, namespaces, *per_request)):
            try:
                req = Req(uuid.uuid4().hex, toks, SamplingParams.from_dict(params), namespace=ns,
                          logprob=LogprobParams(*lp), retention=retention)
                self.core.validate(req)
            except RadixKVError as e:
                raise type(e)(str(e) if single else f"request [{i}]: {e}") from None
            reqs.append(req)
        return reqs, single

    def _result(self, req: Req, collected: Collected, out: ReqOutput) -> dict[str, Any]:
        ids = collected.ids
        p = req.params
        text = self.tokenizer.decode(ids, p.skip_special_tokens, p.spaces_between_special_tokens) if self.tokenizer else ""
        return {"text": text if p.no_stop_trim else trim_stop_string(text, out.finish_reason), "output_ids": ids,
                "meta_info": out.meta_info() | collected.logprob_meta(*astuple(req.logprob))}
