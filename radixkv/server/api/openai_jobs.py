"""What both OpenAI endpoints build and report: a prompt's `Job` (its n samples, validated),
finish reasons, tool calls and usage in OpenAI's shapes (split from openai.py, which serves them)."""

from __future__ import annotations

from typing import Any

from radixkv.bootstrap import Bootstrap, bootstraps
from radixkv.errors import InvalidRequestError
from radixkv.retention import Retention
from radixkv.sampling_params import LogprobParams, SamplingParams
from radixkv.server.api.pipeline import Generation, Usage, with_call_grammar
from radixkv.server.api.protocol import check_choices, openai_retention, sampling_dict
from radixkv.server.api.tools import ToolCall, ToolSet
from radixkv.server.runtime.tokenizer_manager import Chunk, TokenizerManager
from radixkv.tenancy import salt_namespace


def finish_reason_name(reason: dict[str, Any] | None) -> str | None:
    return None if reason is None else reason.get("type")


def chat_finish_reason(reason: dict[str, Any] | None, called: bool) -> str | None:
    """OpenAI's chat finish reason: `tool_calls` when the output ended (not cut) on calls."""
    name = finish_reason_name(reason)
    return "tool_calls" if called and name == "stop" else name


def call_json(call: ToolCall, index: int | None = None) -> dict[str, Any]:
    """A tool call as OpenAI's chat API shows it (with `index` in a stream's delta)."""
    out = {"id": call.id, "type": "function", "function": {"name": call.name, "arguments": call.arguments}}
    return out if index is None else {"index": index, **out}


def openai_usage(usage: Usage) -> dict[str, Any]:
    """OpenAI's usage: where the cached tokens came from (`{device, host, storage}`) beside
    their sum, as SGLang does (`cached_tokens_details`), and every prompt token by why it hit or
    missed (`cache`, `radixkv.mem.miss_causes`; omitted where a lookup was not explained)."""
    details: dict[str, Any] = {"cached_tokens": usage.cached_tokens, "cached_tokens_details": usage.cached}
    if usage.causes is not None:
        details["cache"] = usage.causes
    return {"prompt_tokens": usage.prompt_tokens, "completion_tokens": usage.completion_tokens,
            "total_tokens": usage.total_tokens, "prompt_tokens_details": details}


class Job:
    """One prompt and its n samples, validated; knows how much of the prompt was cached.
    `namespace`: the request's `cache_salt` namespace (None: the shared tree); `echo`: the
    prompt's text, to put before each completion (OpenAI's `echo`); `retention`: how long the
    cache is asked to keep its prefixes (`radixkv.retention`)."""

    def __init__(self, ids: list[int], params: list[SamplingParams], logprob: LogprobParams,
                 namespace: str | None = None, echo: str | None = None, retention: Retention | None = None,
                 bootstrap: Bootstrap | None = None, lora: str | None = None):
        self.ids, self.params, self.logprob, self.namespace, self.echo = ids, params, logprob, namespace, echo
        self.retention, self.bootstrap, self.lora = retention, bootstrap, lora
        self.cached: Chunk | None = None  # the prompt's lookup before this request's samples (n > 1)

    def generations(self) -> list[Generation]:
        return [Generation(self.ids, p, self.logprob, self.namespace, self.retention, bootstrap=self.bootstrap,
                           lora=self.lora) for p in self.params]

    async def prefill_if_shared(self, manager: TokenizerManager) -> None:
        """n > 1: compute the prompt once, so every sample reads it from the cache."""
        if len(self.params) > 1:
            _, _, self.cached = await self.generations()[0].prefill().generate(manager)


def jobs_for(manager: TokenizerManager, prompts: list[list[int]], body, max_tokens: int | None,
             echoes: list[str | None] | None = None, tools: ToolSet | None = None, lora: str | None = None) -> list[Job]:
    """One `Job` per prompt; with `tools` forced (`required` or a named function), every sample
    is generated under the tools' call grammar."""
    check_choices(body)
    jobs = []
    logprob = body.logprob_params()
    namespace = salt_namespace(body.cache_salt)
    retention = openai_retention(body.prompt_cache_retention, body.prompt_cache_key)
    rooms = bootstraps(body.bootstrap_host, body.bootstrap_port, body.bootstrap_room, len(prompts))
    if body.n > 1 and any(rooms):
        raise InvalidRequestError("bootstrap_room: a prefill/decode pair runs one sample per prompt (n=1)")
    for ids, echo, room in zip(prompts, echoes or [None] * len(prompts), rooms):
        max_new = max_tokens if max_tokens is not None else max(0, manager.limits.context_length - len(ids))
        dicts = [sampling_dict(body, max_new, j) for j in range(body.n)]
        dicts = [with_call_grammar(d, tools) for d in dicts]
        params = [SamplingParams.from_dict(d) for d in dicts]
        manager.check(ids, params[0], logprob)
        jobs.append(Job(ids, params, logprob, namespace, echo, retention, room, lora))
    return jobs


def job_cached(job: Job, lasts: list[Chunk]) -> Chunk:
    """The chunk that says what the cache held of the prompt: the first sample's, or, when the
    prompt was prefilled once for n samples, that prefill's."""
    return job.cached if job.cached is not None else lasts[0]
