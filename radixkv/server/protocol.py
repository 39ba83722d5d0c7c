"""Request bodies of the HTTP API, validated strictly: an unknown field is an error naming it.

Native `/generate` takes SGLang's shape; `/v1/chat/completions` and `/v1/completions` take
OpenAI's. Fields OpenAI defines that this runtime does not implement are refused by name
(`UNSUPPORTED_*`), never silently ignored.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from radixkv.errors import InvalidRequestError
from radixkv.sampling_params import SEED_MAX, SEED_MIN, LogprobParams


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=False)


class GenerateBody(Strict):
    """POST /generate: one prompt or a batch, as text or token ids."""

    text: str | list[str] | None = None
    input_ids: list[int] | list[list[int]] | None = None
    sampling_params: dict[str, Any] | None = None
    stream: bool = False
    rid: str | list[str] | None = None
    return_logprob: bool | list[bool] = False
    logprob_start_len: int | list[int] = -1
    top_logprobs_num: int | list[int] = 0


class AbortBody(Strict):
    rid: str


class DetokenizeBody(Strict):
    """POST /detokenize: `input_ids` (vLLM's shape: `tokens`, with `model`) -> text."""

    input_ids: list[int] | None = None
    tokens: list[int] | None = None  # vLLM's name for input_ids
    skip_special_tokens: bool = False
    model: str | None = None


class StreamOptions(Strict):
    include_usage: bool = False


class TextPart(Strict):
    type: Literal["text"]
    text: str


class ChatMessage(Strict):
    role: Literal["system", "user", "assistant", "tool", "developer"]
    content: str | list[TextPart] | None = None

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)

    def template_message(self) -> dict[str, str]:
        """As a chat template takes it (OpenAI's `developer` role is a system message)."""
        return {"role": "system" if self.role == "developer" else self.role, "content": self.text()}


class TokenizeBody(Strict):
    """POST /tokenize: `text` alone (no BOS added), or `messages` through the chat template.
    vLLM's shape is taken too: `prompt` for `text`, with `model` and `add_special_tokens`
    (true: the tokenizer's special tokens, a BOS, are added as vLLM adds them)."""

    text: str | None = None
    prompt: str | None = None  # vLLM's name for text
    messages: list[ChatMessage] | None = None
    add_generation_prompt: bool = True
    model: str | None = None  # vLLM: the served model's name (one model here: informational)
    add_special_tokens: bool | None = None  # vLLM: default true for a prompt


class SamplingFields(Strict):
    """Sampling fields common to both OpenAI endpoints (plus SGLang/vLLM's usual extensions)."""

    model: str
    temperature: float | None = Field(default=None)
    top_p: float | None = None
    n: int = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = None
    seed: int | None = Field(default=None, ge=SEED_MIN, le=SEED_MAX)  # 64 bits, as a torch generator takes
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    user: str | None = None  # the end user's id: recorded in the request log
    prompt_cache_key: str | None = None  # OpenAI's cache-routing hint: the router pins on it; one server ignores it
    # extensions (as in SGLang and vLLM)
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    min_tokens: int | None = None
    ignore_eos: bool | None = None
    response_format: dict[str, Any] | None = None  # {"type": "text" | "json_object" | "json_schema", ...}
    regex: str | None = None
    ebnf: str | None = None


class ChatCompletionBody(SamplingFields):
    messages: list[ChatMessage]
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None

    def logprob_params(self) -> LogprobParams:
        if self.top_logprobs and not self.logprobs:
            raise InvalidRequestError("top_logprobs needs logprobs=true")
        return LogprobParams(bool(self.logprobs), -1, self.top_logprobs or 0)


class CompletionBody(SamplingFields):
    prompt: str | list[str] | list[int] | list[list[int]]
    max_tokens: int | None = 16  # OpenAI's default for completions
    logprobs: int | None = None  # how many alternatives per token (0: only the chosen token's)

    def logprob_params(self) -> LogprobParams:
        if self.logprobs is None:
            return LogprobParams()
        if self.logprobs < 0:
            raise InvalidRequestError(f"logprobs={self.logprobs}: must be >= 0")
        return LogprobParams(True, -1, self.logprobs)


MAX_N = 16
UNSUPPORTED_CHAT = ("logit_bias", "tools", "tool_choice", "parallel_tool_calls",
                    "functions", "function_call", "audio", "modalities", "prediction",
                    "store", "metadata", "service_tier", "reasoning_effort", "web_search_options")
UNSUPPORTED_COMPLETION = ("echo", "best_of", "suffix", "logit_bias")


def refuse_unsupported(body: dict[str, Any], names: tuple[str, ...]) -> None:
    """400 for OpenAI fields this runtime does not implement (even when set to their default,
    a client sending them expects them honoured)."""
    found = sorted(n for n in names if n in body and body[n] is not None)
    if found:
        raise InvalidRequestError(f"unsupported field(s) {found}: this server does not implement them")


def check_choices(body: SamplingFields) -> None:
    """`n` (and the per-choice seeds it implies) within range, before anything indexes choices."""
    if not 1 <= body.n <= MAX_N:
        raise InvalidRequestError(f"n={body.n}: must be in [1, {MAX_N}]")
    if body.seed is not None and body.seed + body.n - 1 > SEED_MAX:
        raise InvalidRequestError(f"seed={body.seed}: choice j samples with seed + j, which must fit in 64 bits "
                                  f"(at most {SEED_MAX})")


def sampling_dict(body: SamplingFields, max_new_tokens: int, choice: int = 0) -> dict[str, Any]:
    """OpenAI fields -> our `sampling_params` (a seed differs per choice, so n > 1 samples differ)."""
    check_choices(body)
    params: dict[str, Any] = {"max_new_tokens": max_new_tokens}
    for ours, theirs in (("temperature", "temperature"), ("top_p", "top_p"), ("top_k", "top_k"),
                         ("min_p", "min_p"), ("frequency_penalty", "frequency_penalty"),
                         ("presence_penalty", "presence_penalty"), ("repetition_penalty", "repetition_penalty"),
                         ("min_new_tokens", "min_tokens"), ("ignore_eos", "ignore_eos")):
        value = getattr(body, theirs)
        if value is not None:
            params[ours] = value
    if body.stop is not None:
        params["stop"] = [body.stop] if isinstance(body.stop, str) else list(body.stop)
    if body.seed is not None:
        params["seed"] = body.seed + choice
    for name in ("regex", "ebnf"):
        if getattr(body, name) is not None:
            params[name] = getattr(body, name)
    schema = response_format_schema(body.response_format)
    if schema is not None:
        params["json_schema"] = schema
    return params


def response_format_schema(fmt: dict[str, Any] | None) -> dict[str, Any] | None:
    """OpenAI `response_format` -> the JSON schema to constrain to (None: free text)."""
    if fmt is None:
        return None
    kind = fmt.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return {"type": "object"}
    if kind == "json_schema":
        spec = fmt.get("json_schema")
        if not isinstance(spec, dict) or not isinstance(spec.get("schema"), dict):
            raise InvalidRequestError("response_format.json_schema.schema: required, a JSON schema object")
        return spec["schema"]
    raise InvalidRequestError(f"response_format.type={kind!r}: must be text, json_object or json_schema")
