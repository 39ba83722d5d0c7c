"""Engine: the offline, in-process API (model runner + scheduler + tokenizer, no HTTP).

    import radixkv
    with radixkv.Engine() as engine:                      # embedded default model
        out = engine.generate("The capital of France is", {"max_new_tokens": 16, "temperature": 0})
        outs = engine.generate(["a", "b"], {"max_new_tokens": 8})
        outs = engine.generate(input_ids=[[1, 2, 3]], sampling_params={"max_new_tokens": 4})

Each output is `{"text", "output_ids", "meta_info": {"id", "prompt_tokens", "cached_tokens",
"completion_tokens", "finish_reason", "ttft", "e2e_latency"}}`.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator, Sequence
from typing import Any

from radixkv.config import EngineConfig
from radixkv.errors import EngineError, InvalidRequestError, RadixKVError
from radixkv.logs import setup_logging
from radixkv.model.runner import ModelRunner
from radixkv.sampling_params import SamplingParams
from radixkv.sched import Req, ReqOutput, Scheduler
from radixkv.sched.stop import trim_stop_string
from radixkv.tokenizer import IncrementalDetokenizer, Tokenizer

logger = logging.getLogger(__name__)


class Engine:
    """Offline generation with continuous batching over the radix prefix cache."""

    def __init__(self, model: str | None = None, *, progress: bool = True, **options: Any):
        self.config = EngineConfig.from_kwargs(model=model, **options)
        setup_logging(self.config.log_level)
        self.runner = ModelRunner(self.config, progress=progress)
        self.tokenizer = Tokenizer.from_model_dir(self.runner.model_dir)
        eos = self.tokenizer.eos_token_ids if self.tokenizer else frozenset()
        self.scheduler = Scheduler(self.config, self.runner, self.tokenizer, eos)
        self._closed = False

    # -- generation ------------------------------------------------------------------------------
    def generate(
        self,
        prompt: str | Sequence[str] | None = None,
        sampling_params: dict | SamplingParams | Sequence[dict | SamplingParams] | None = None,
        input_ids: Sequence[int] | Sequence[Sequence[int]] | None = None,
        namespace: Any = None,
    ) -> dict[str, Any] | list[dict[str, Any]]:
        """Generate for one prompt (returns a dict) or a batch (returns a list, in order).

        Every request is validated before any runs: a bad one raises `InvalidRequestError`
        naming its index and field, and the engine keeps serving.
        """
        reqs, single = self._make_requests(prompt, sampling_params, input_ids, namespace)
        for req in reqs:
            self.scheduler.add_request(req)
        done: dict[str, ReqOutput] = {}
        try:
            while len(done) < len(reqs):
                for out in self.scheduler.step():
                    if out.finished:
                        done[out.rid] = out
                if not self.scheduler.has_work and len(done) < len(reqs):
                    raise EngineError("the scheduler went idle with requests unfinished")
        finally:
            for req in reqs:  # on any error, nothing stays queued, locked or allocated
                if req.rid not in done:
                    self.scheduler.abort(req.rid)
        results = [self._result(req, done[req.rid]) for req in reqs]
        return results[0] if single else results

    def generate_stream(
        self,
        prompt: str | None = None,
        sampling_params: dict | SamplingParams | None = None,
        input_ids: Sequence[int] | None = None,
        namespace: Any = None,
    ) -> Iterator[dict[str, Any]]:
        """Yield `{"text": delta, "output_ids": new ids, "finished": bool, "meta_info"}` chunks
        for one request as it decodes; closing the iterator early aborts the request."""
        if self.tokenizer is None:
            raise InvalidRequestError(f"{self.runner.model_dir} has no tokenizer to stream text with")
        reqs, single = self._make_requests(prompt, sampling_params, input_ids, namespace)
        if not single:
            raise InvalidRequestError("generate_stream takes a single prompt")
        req = reqs[0]
        detok = IncrementalDetokenizer(self.tokenizer, req.params.skip_special_tokens)
        # hold back text that could be the start of a stop string until it is decided
        holdback = max((len(x) for x in req.params.stop), default=1) - 1
        sent_ids, sent_text, finished = 0, "", False
        try:
            self.scheduler.add_request(req)
            while not finished:
                for out in self.scheduler.step():
                    if out.rid != req.rid:
                        continue
                    detok.step(out.output_ids)
                    finished = out.finished
                    if finished:  # the same text, trimmed at the stop string that ended it
                        detok.finish(out.output_ids)
                        text = trim_stop_string(detok.text, out.finish_reason)
                    else:
                        text = detok.text[: len(detok.text) - holdback] if holdback else detok.text
                    delta = text[len(sent_text):] if len(text) > len(sent_text) else ""
                    sent_text += delta
                    yield {"text": delta, "output_ids": out.output_ids[sent_ids:], "finished": finished,
                           "meta_info": self._meta(out)}
                    sent_ids = len(out.output_ids)
                if not finished and not self.scheduler.has_work:
                    raise EngineError("the scheduler went idle with the request unfinished")
        finally:
            if not finished:
                self.scheduler.abort(req.rid)

    def chat(self, messages: list[dict[str, Any]], sampling_params: dict | None = None, **kw) -> dict[str, Any]:
        """Generate the assistant's reply to `messages` through the model's chat template."""
        if self.tokenizer is None:
            raise InvalidRequestError(f"{self.runner.model_dir} has no tokenizer (and no chat template)")
        return self.generate(input_ids=self.tokenizer.apply_chat_template(messages),
                             sampling_params=sampling_params, **kw)

    def abort(self, rid: str) -> bool:
        """Stop request `rid`, returning everything it holds; whether it was in flight."""
        self._check_open()
        return self.scheduler.abort(rid) is not None

    # -- control and stats -----------------------------------------------------------------------
    def flush_cache(self) -> bool:
        """Empty the prefix cache; False (nothing done) while requests are in flight."""
        self._check_open()
        return self.scheduler.flush_cache()

    def get_stats(self) -> dict[str, Any]:
        """Cache hit rate, token usage, free/evictable/protected tokens, queue lengths, counters."""
        self._check_open()
        return self.scheduler.get_stats()

    def check_invariants(self) -> None:
        self._check_open()
        self.scheduler.check_invariants()

    def shutdown(self) -> None:
        """Abort whatever is in flight and release the model and the KV pool."""
        if self._closed:
            return
        for rid in list(self.scheduler.reqs):
            self.scheduler.abort(rid)
        self._closed = True
        del self.scheduler, self.runner

    def _check_open(self) -> None:
        if self._closed:
            raise EngineError("this engine has been shut down")

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.shutdown()

    # -- helpers ---------------------------------------------------------------------------------
    def _make_requests(self, prompt, sampling_params, input_ids, namespace) -> tuple[list[Req], bool]:
        self._check_open()
        if (prompt is None) == (input_ids is None):
            raise InvalidRequestError("give exactly one of prompt or input_ids")
        if prompt is not None:
            if self.tokenizer is None:
                raise InvalidRequestError(f"{self.runner.model_dir} has no tokenizer: pass input_ids")
            single = isinstance(prompt, str)
            prompts = [prompt] if single else list(prompt)
            ids = [self.tokenizer.encode(p) for p in prompts]
        else:
            single = not input_ids or not isinstance(input_ids[0], (list, tuple))
            ids = [list(input_ids)] if single else [list(x) for x in input_ids]
        if not ids:
            raise InvalidRequestError("the batch is empty")
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
        reqs = []
        for i, (toks, params, ns) in enumerate(zip(ids, params_list, namespaces)):
            try:
                req = Req(uuid.uuid4().hex, toks, SamplingParams.from_dict(params), namespace=ns)
                self.scheduler.validate(req)
            except RadixKVError as e:
                raise type(e)(str(e) if single else f"request [{i}]: {e}") from None
            reqs.append(req)
        return reqs, single

    def _meta(self, out: ReqOutput) -> dict[str, Any]:
        return {"id": out.rid, "prompt_tokens": out.prompt_tokens, "cached_tokens": out.cached_tokens,
                "completion_tokens": out.completion_tokens, "finish_reason": out.finish_reason,
                "ttft": out.ttft, "e2e_latency": out.latency}

    def _result(self, req: Req, out: ReqOutput) -> dict[str, Any]:
        text = self.tokenizer.decode(out.output_ids, req.params.skip_special_tokens) if self.tokenizer else ""
        return {"text": trim_stop_string(text, out.finish_reason), "output_ids": out.output_ids,
                "meta_info": self._meta(out)}
