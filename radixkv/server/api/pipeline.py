"""The one request pipeline every generating endpoint runs, as SGLang's `serving_base.py` and
vLLM's serving classes do:

    parse -> validate -> build the generations -> run them (tokenizer manager) -> encode

`Serving` runs it; each endpoint is a subclass that translates its API into it (`parse`,
`build`: the body into `Generation` records) and out of it (`respond`: a whole response from
the results; `events`: a stream's events from the chunks, which `http.sse` encodes in the
API's `StreamFormat`). What a response used is one `Usage` record, which each API translates
into its own usage shape.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, TypeVar

from fastapi import Request

from radixkv import tenancy
from radixkv.bootstrap import Bootstrap
from radixkv.errors import EngineError, InvalidRequestError, RadixKVError
from radixkv.grammar_spec import normalise_json_schema
from radixkv.mem.miss_causes import CAUSES
from radixkv.results import Collected
from radixkv.retention import Retention
from radixkv.sampling_params import LogprobParams, SamplingParams
from radixkv.server.api.tools import ToolSet
from radixkv.server.http.common import (
    HTTPError,
    all_or_none,
    cache_owner,
    first_then_rest,
    off_loop,
    principal,
    until_disconnected,
)
from radixkv.server.http.sse import PLAIN, Event, StreamFormat, streaming_response
from radixkv.server.runtime.tokenizer_manager import Chunk, Ticket, TokenizerManager

T = TypeVar("T")
TIERS = ("device", "host", "storage")
Result = tuple[str, Collected, Chunk]  # (text, everything it produced, its last chunk): TokenizerManager.generate


@dataclass(slots=True)
class Generation:
    """One request for the runtime, as an API's translation built it: the prompt, how it
    samples, and what the tokenizer manager takes beside them (`TokenizerManager.stream`)."""

    ids: list[int]
    params: SamplingParams
    logprob: LogprobParams = LogprobParams()
    namespace: str | None = None  # its cache namespace: the salt's, then the asker's (`Serving.scoped`)
    retention: Retention | None = None  # how long the cache is asked to keep its prefixes
    rid: str | None = None  # the client's name for it
    principal: str = ""  # whose name `rid` is
    ticket: Ticket | None = None  # the room its body was admitted with (`TokenizerManager.admit`)
    bootstrap: Bootstrap | None = None  # its prefill/decode pair's room (`radixkv.disagg`)
    lora: str | None = None  # the id of the LoRA adapter it runs under (None: the base model)

    def stream(self, manager: TokenizerManager) -> AsyncIterator[Chunk]:
        return manager.stream(self.ids, self.params, self.rid, self.namespace, self.logprob, self.principal,
                              self.retention, self.ticket, self.bootstrap, self.lora)

    async def generate(self, manager: TokenizerManager) -> Result:
        return await manager.generate(self.ids, self.params, self.rid, self.namespace, self.logprob,
                                      self.principal, self.retention, self.ticket, self.bootstrap, self.lora)

    def prefill(self) -> Generation:
        """The prompt alone (no token sampled): run once before n samples, it leaves the prompt
        in the cache for all of them."""
        return Generation(self.ids, SamplingParams(max_new_tokens=0), namespace=self.namespace,
                          retention=self.retention, lora=self.lora)


@dataclass(frozen=True, slots=True)
class Usage:
    """What a response used, over the requests it ran: the one record each API's usage shape is
    translated from."""

    prompt_tokens: int
    completion_tokens: int
    cached: dict[str, int]  # tier (`TIERS`) -> prompt tokens the cache served from it
    causes: dict[str, int] | None  # every prompt token by why it hit or missed; None: a lookup was not explained

    @classmethod
    def of(cls, prompt_tokens: int, completion_tokens: int, served: list[Chunk]) -> Usage:
        """Usage of prompts whose cache lookups `served` reports (one chunk per prompt)."""
        cached = {tier: sum(c.cached_tokens_details()[tier] for c in served) for tier in TIERS}
        causes = None
        if served and all(c.cache_causes is not None for c in served):
            causes = {cause: sum(c.cache_causes.get(cause, 0) for c in served) for cause in CAUSES}
        return cls(prompt_tokens, completion_tokens, cached, causes)

    @property
    def cached_tokens(self) -> int:
        return sum(self.cached.values())

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


class Serving:
    """One generating endpoint: `handle` runs the pipeline; a subclass fills in its steps.

    `parse` reads and validates the body, `build` turns it into generations (validated against
    the runtime's limits), `prefill` runs what the samples share first (n > 1), `streams` says
    whether the client asked for a stream; then `respond` makes the whole response from the
    results in order, or `events` the stream's events from `(index, chunk)` pairs."""

    stream_format: StreamFormat = PLAIN
    client_names: dict[str, str] | None = None
    """The API's names for the runtime's fields (`in_client_terms`); None: the runtime's own."""

    def __init__(self, request: Request):
        self.request = request
        self.manager: TokenizerManager = request.app.state.manager
        self.settings = request.app.state.settings

    async def handle(self) -> Any:
        """The pipeline; a bad request's error in the API's own field names (`client_names`),
        whether the body was refused here or the scheduler refused it (a grammar it cannot run)."""
        try:
            return await self._handle()
        except InvalidRequestError as e:
            if self.client_names is None:
                raise
            raise InvalidRequestError(in_client_terms(str(e), self.client_names)) from None

    async def _handle(self) -> Any:
        body = await self.parse()
        generations = self.scoped(await off_loop(self.build, body))
        with self.manager.admit(len(generations)) as ticket:  # the whole body, or a 4xx before any runs
            for g in generations:
                g.ticket = ticket
            await until_disconnected(self.request, self.prefill(generations))
            if self.streams(body):
                chunks = await started(self.request, merged(self.manager, generations))
                return streaming_response(self.events(body, generations, chunks), self.stream_format)
            results = await until_disconnected(self.request,
                                               all_or_none(*(g.generate(self.manager) for g in generations)))
        return self.respond(body, generations, results)

    def scoped(self, generations: list[Generation]) -> list[Generation]:
        """The generations as the asker's: their rids named in their principal, their prefixes
        cached in their namespace (`radixkv.tenancy`: no other key hits or sees them)."""
        who, owner = principal(self.request), cache_owner(self.request)
        for g in generations:
            g.principal = who
            g.namespace = tenancy.namespace(owner, g.namespace)
        return generations

    async def parse(self) -> Any:
        raise NotImplementedError

    def build(self, body: Any) -> list[Generation]:
        raise NotImplementedError

    async def prefill(self, generations: list[Generation]) -> None:
        """Nothing by default."""

    def streams(self, body: Any) -> bool:
        return bool(body.stream)

    def respond(self, body: Any, generations: list[Generation], results: list[Result]) -> Any:
        raise NotImplementedError

    def events(self, body: Any, generations: list[Generation], chunks: AsyncIterator[tuple[int, Chunk]]
               ) -> AsyncIterator[Event]:
        raise NotImplementedError

    def check_model(self, name: str) -> str | None:
        """The LoRA adapter id the `model` field names (None: the base model); 404 if unknown."""
        return check_model(self.request, name)

    def max_new_tokens(self, given: int | None, prompt_len: int) -> int:
        """`given`, or what the context leaves after the prompt."""
        return given if given is not None else max(0, self.manager.limits.context_length - prompt_len)


def in_client_terms(message: str, names: dict[str, str]) -> str:
    """An error about the runtime's fields (`sampling_params.max_new_tokens`) in the names the
    client sent (`max_tokens`): `sampling_params.` dropped, each name in `names` translated
    (bare too, where it is an identifier with an underscore: `max_new_tokens`, not `stop`)."""
    message = re.sub(r"\bsampling_params\.(\w+)", lambda m: names.get(m.group(1), m.group(1)), message)
    bare = [name for name in names if "_" in name]
    if bare:
        words = re.compile(r"\b(" + "|".join(map(re.escape, bare)) + r")\b")
        message = words.sub(lambda m: names[m.group(1)], message)
    return message


def check_model(request: Request, name: str) -> str | None:
    """The LoRA adapter `name` names (None: the base model); 404 for a model this server lacks.
    An adapter is named by its name, or as `BASE:ADAPTER` (SGLang's form)."""
    settings, manager = request.app.state.settings, request.app.state.manager
    if name in (settings.model_name, manager.info["model_dir"]):
        return None
    base, sep, adapter = name.rpartition(":")
    candidate = adapter if sep and base in (settings.model_name, manager.info["model_dir"]) else name
    if candidate in manager.lora_adapters:
        return manager.lora_adapters[candidate]
    loras = f" or one of its LoRA adapters {sorted(manager.lora_adapters)}" if manager.lora_adapters else ""
    raise HTTPError(404, f"model {name!r} does not exist; this server serves {settings.model_name!r}{loras} "
                         f"(see GET /v1/models)", "not_found")


def with_call_grammar(params: dict[str, Any], tools: ToolSet | None) -> dict[str, Any]:
    """`params` constrained for `tools`, as OpenAI applies a response format: to the final
    answer, never to a call. `tool_choice` required or named: the output is the tools' call
    grammar (a response format is for a later turn's answer). `auto` with a response format:
    a call, or an answer in the format. Without tools to call, `params` as they are."""
    if tools is None or not tools.parses_calls:
        return params
    given = [name for name in ("regex", "ebnf") if name in params]
    if given and tools.forced:
        raise InvalidRequestError(f"tool_choice={tools.choice.mode!r} constrains the output to a tool call; it "
                                  f"cannot be combined with {given[0]}")
    rest = {k: v for k, v in params.items() if k != "json_schema"}
    if tools.forced:
        return {**rest, "ebnf": tools.grammar()}
    if "json_schema" in params:
        return {**rest, "ebnf": tools.grammar(answer=normalise_json_schema(params["json_schema"]))}
    return params


async def merged(manager: TokenizerManager, generations: list[Generation]) -> AsyncIterator[tuple[int, Chunk]]:
    """(index in `generations`, chunk) from several requests as they arrive; a failed chunk
    raises. Leaving early (a client that disconnects) cancels every request still running."""
    queue: asyncio.Queue = asyncio.Queue()

    async def pump(index: int, generation: Generation) -> None:
        try:
            async for chunk in generation.stream(manager):
                await queue.put((index, chunk))
        except RadixKVError as e:
            await queue.put((index, e))
        except Exception as e:  # noqa: BLE001 - never leave the consumer waiting for a dead pump
            await queue.put((index, EngineError(f"choice {index} failed: {type(e).__name__}: {e}")))

    tasks = [asyncio.create_task(pump(i, g)) for i, g in enumerate(generations)]
    try:
        remaining = len(generations)
        while remaining:
            index, item = await queue.get()
            if isinstance(item, Exception):
                raise item
            item.raise_if_error()
            if item.finished:
                remaining -= 1
            yield index, item
    finally:
        for task in tasks:
            task.cancel()


async def started(request: Request, chunks: AsyncIterator[T]) -> AsyncIterator[T]:
    """`chunks` once the first has come: a request that fails at once is an HTTP error, not a
    200 stream holding one."""
    try:
        _, rest = await first_then_rest(request, chunks)
    except BaseException:
        await chunks.aclose()
        raise
    return rest


async def only(chunks: AsyncIterator[tuple[int, Chunk]]) -> AsyncIterator[Chunk]:
    """The chunks of a single generation's stream, without their index."""
    async for _, chunk in chunks:
        yield chunk
