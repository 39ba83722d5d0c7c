"""Request bodies of the HTTP API, validated strictly: an unknown field is an error naming it.

Native `/generate` takes SGLang's shape; `/v1/chat/completions` and `/v1/completions` take
OpenAI's. Fields OpenAI defines that this runtime does not implement are refused by name
(`UNSUPPORTED_*`), never silently ignored.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from radixkv.errors import InvalidRequestError
from radixkv.retention import CONVERSATION_SECONDS, Retention
from radixkv.sampling_params import SEED_MAX, SEED_MIN, LogprobParams
from radixkv.tenancy import salt_namespace


class Strict(BaseModel):
    """A body or part of one: an unknown field is an error naming it, and a value must have its
    field's JSON type (`true` is not the integer 1, `"3"` is not 3)."""

    model_config = ConfigDict(extra="forbid", strict=True)


class GenerateBody(Strict):
    """POST /generate: one prompt or a batch, as text or token ids (SGLang's request).

    Beyond what it implements, it takes the fields SGLang's frontend and router send that are
    pure hints here (`HINT_FIELDS`: accepted, no effect on output) and, set to their off value
    only, the fields whose features this server lacks (`OFF_ONLY_FIELDS`: a 400 naming the field
    when set)."""

    text: str | list[str] | None = None
    input_ids: list[int] | list[list[int]] | None = None
    sampling_params: dict[str, Any] | list[dict[str, Any]] | None = None
    stream: bool = False
    rid: str | list[str] | None = None
    return_logprob: bool | list[bool] | None = False
    logprob_start_len: int | list[int] | None = -1
    top_logprobs_num: int | list[int] | None = 0
    return_text_in_logprobs: bool = False  # log-prob entries [logprob, token_id, token_text]
    extra_key: str | None = None  # SGLang's cache namespace (a salt): prefixes are shared within one key only
    cache_salt: str | None = None  # vLLM's name for the same
    # hints (SGLang's; no effect on output here)
    model: str | None = None  # the router names the model; one model is served
    log_metrics: bool = True  # metrics are always recorded
    no_logs: bool = False  # prompts and outputs are never logged here
    session_id: str | None = None
    conversation_id: str | None = None
    routing_key: str | None = None
    custom_labels: dict[str, str] | None = None
    data_parallel_rank: int | None = None
    lora_path: str | list[str | None] | None = None  # the LoRA adapter of each prompt, by name (None: the base model)
    # prefill/decode disaggregation (SGLang's PD router adds these; see radixkv.disagg)
    bootstrap_host: str | list[str | None] | None = None
    bootstrap_port: int | list[int | None] | None = None
    bootstrap_room: int | list[int | None] | None = None
    # features this server does not have: accepted only when off
    return_hidden_states: bool | list[bool] = False
    background: bool = False
    return_bytes: bool = False
    return_entropy: bool = False
    return_routed_experts: bool = False
    token_ids_logprob: list[int] | list[list[int]] | None = None
    lora_id: str | list[str | None] | None = None
    image_data: Any = None
    video_data: Any = None
    audio_data: Any = None
    input_embeds: Any = None
    modalities: list[str] | None = None
    session_params: dict[str, Any] | None = None
    custom_logit_processor: str | list[str | None] | None = None
    bootstrap_pair_key: str | list[str | None] | None = None

    def refuse_features_it_lacks(self) -> None:
        """400 for a field whose feature this server lacks, when the request turns it on."""
        refuse_if_on(self, OFF_ONLY_FIELDS)
        if self.data_parallel_rank not in (None, 0):
            raise InvalidRequestError(f"data_parallel_rank={self.data_parallel_rank}: this server is one "
                                      f"data-parallel rank (0); route through the router for others")
        if self.extra_key is not None and self.cache_salt is not None and self.extra_key != self.cache_salt:
            raise InvalidRequestError("give extra_key or cache_salt (two names for the cache namespace), not both")

    @property
    def namespace(self) -> str | None:
        return salt_namespace(self.extra_key if self.extra_key is not None else self.cache_salt)


HINT_FIELDS = ("model", "log_metrics", "no_logs", "session_id", "conversation_id", "routing_key", "custom_labels",
               "data_parallel_rank")
OFF_ONLY_FIELDS = ("return_hidden_states", "background", "return_bytes", "return_entropy", "return_routed_experts",
                   "token_ids_logprob", "lora_id", "image_data", "video_data", "audio_data",
                   "input_embeds", "modalities", "session_params", "custom_logit_processor", "bootstrap_pair_key")


def refuse_if_on(body: BaseModel, names: tuple[str, ...]) -> None:
    """400 naming the first of `names` (fields whose feature this server lacks) that `body` turns on."""
    on = [name for name in names if _is_on(getattr(body, name))]
    if on:
        raise InvalidRequestError(f"{on[0]}={getattr(body, on[0])!r}: not supported by this server "
                                  f"(accepted only when off: false, null or empty)")


def _is_on(value: Any) -> bool:
    if isinstance(value, list):
        return any(_is_on(v) for v in value)
    return value not in (None, False, "", {}, [])


class ConcatAppendBody(Strict):
    """POST /concate_and_append_request (SGLang frontend's parallel encoding)."""

    src_rids: list[str]
    dst_rid: str


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


class FunctionCall(Strict):
    name: str
    arguments: str  # JSON text of an object, as OpenAI sends it


class ChatToolCall(Strict):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(Strict):
    role: Literal["system", "user", "assistant", "tool", "developer"]
    content: str | list[TextPart] | None = None
    name: str | None = None  # a participant's name: given to the chat template (most templates ignore it)
    tool_calls: list[ChatToolCall] | None = None  # an assistant's calls
    tool_call_id: str | None = None  # a tool message: the call it answers
    # an assistant's reasoning, as `--reasoning-parser` returned it: given to the chat template,
    # whose own rule keeps or drops it (Qwen3's keeps it only after the last user query)
    reasoning_content: str | None = None

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)

    def template_message(self, where: str = "message") -> dict[str, Any]:
        """As a chat template takes it (OpenAI's `developer` role is a system message). Only an
        assistant message that calls tools may leave out its content (OpenAI's rule)."""
        if self.content is None and not (self.role == "assistant" and self.tool_calls):
            raise InvalidRequestError(f"{where}.content: required in a {self.role} message (null only in an "
                                      f"assistant message with tool_calls)")
        message: dict[str, Any] = {"role": "system" if self.role == "developer" else self.role, "content": self.text()}
        if self.name is not None:
            message["name"] = self.name
        if self.tool_calls:
            if self.role != "assistant":
                raise InvalidRequestError(f"{where}.tool_calls: only an assistant message holds tool calls")
            message["tool_calls"] = [{"id": c.id, "type": "function", "function": {
                "name": c.function.name, "arguments": json_arguments(c.function.arguments,
                                                                      f"{where}.tool_calls[{i}].function.arguments")}}
                for i, c in enumerate(self.tool_calls)]
        if self.reasoning_content is not None:
            if self.role != "assistant":
                raise InvalidRequestError(f"{where}.reasoning_content: only an assistant message holds reasoning")
            message["reasoning_content"] = self.reasoning_content
        if self.role == "tool":
            if self.tool_call_id is None:
                raise InvalidRequestError(f"{where}.tool_call_id: required in a tool message (the call it answers)")
            message["tool_call_id"] = self.tool_call_id
        return message


METADATA_KEYS, METADATA_KEY_CHARS, METADATA_VALUE_CHARS = 16, 64, 512
"""OpenAI's limits on `metadata`: 16 pairs, keys up to 64 characters, values up to 512."""


def check_metadata(metadata: dict[str, str] | None, where: str = "metadata") -> None:
    """400 naming `where` when `metadata` is past OpenAI's limits (what a stored response keeps)."""
    if metadata is None:
        return
    if len(metadata) > METADATA_KEYS:
        raise InvalidRequestError(f"{where}: {len(metadata)} keys, at most {METADATA_KEYS}")
    for key, value in metadata.items():
        if len(key) > METADATA_KEY_CHARS:
            raise InvalidRequestError(f"{where}: the key {key[:METADATA_KEY_CHARS]!r}... is {len(key)} characters, "
                                      f"at most {METADATA_KEY_CHARS}")
        if len(value) > METADATA_VALUE_CHARS:
            raise InvalidRequestError(f"{where}.{key}: {len(value)} characters, at most {METADATA_VALUE_CHARS}")


def json_arguments(text: str, where: str) -> dict[str, Any]:
    """A call's arguments (JSON text of an object) as a dict; 400 naming `where` otherwise."""
    from radixkv.json_text import loads_bounded

    value = loads_bounded(text, where)
    if not isinstance(value, dict):
        raise InvalidRequestError(f"{where}: must be a JSON object")
    return value


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
    user: str | None = None  # the end user's id: accepted, informational (no per-request log is kept)
    prompt_cache_key: str | None = None  # OpenAI's: the router pins on it; the conversation is retained a while
    prompt_cache_retention: Literal["in_memory", "24h"] | None = None  # OpenAI's: how long the prompt stays cached
    cache_salt: str | None = None  # vLLM's and SGLang's: prefixes are shared only among requests with this salt
    # extensions (as in SGLang and vLLM)
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    min_tokens: int | None = None
    ignore_eos: bool | None = None
    response_format: dict[str, Any] | None = None  # {"type": "text" | "json_object" | "json_schema", ...}
    regex: str | None = None
    ebnf: str | None = None
    stop_token_ids: list[int] | None = None
    sampling_seed: int | None = Field(default=None, ge=SEED_MIN, le=SEED_MAX)  # SGLang's name for seed
    skip_special_tokens: bool | None = None
    spaces_between_special_tokens: bool | None = None
    no_stop_trim: bool | None = None
    # prefill/decode disaggregation (SGLang's PD router adds these; see radixkv.disagg)
    bootstrap_host: str | None = None
    bootstrap_port: int | None = None
    bootstrap_room: int | None = None
    lora_path: str | None = None  # SGLang's: the LoRA adapter by name (the `model` field may name it too)
    # SGLang router's: off only here (no hidden states, no sessions)
    return_hidden_states: bool = False
    session_params: dict[str, Any] | None = None

    def refuse_features_it_lacks(self) -> None:
        refuse_if_on(self, ("return_hidden_states", "session_params"))
        if self.seed is not None and self.sampling_seed is not None:
            raise InvalidRequestError("give seed or sampling_seed (SGLang's name for it), not both")


class ChatCompletionBody(SamplingFields):
    messages: list[ChatMessage]
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None
    continue_final_message: bool = False  # the last (assistant) message is continued, not answered
    chat_template_kwargs: dict[str, Any] | None = None  # the template's own variables (enable_thinking, ...)
    # SGLang's reasoning split (--reasoning-parser): false returns the raw text as content
    separate_reasoning: bool = True
    stream_reasoning: bool = True
    tools: list[dict[str, Any]] | None = None  # function tools (see radixkv.server.api.tools)
    tool_choice: str | dict[str, Any] | None = None  # auto, none, required, or {"type": "function", ...}
    parallel_tool_calls: bool | None = None

    def logprob_params(self) -> LogprobParams:
        if self.top_logprobs and not self.logprobs:
            raise InvalidRequestError("top_logprobs needs logprobs=true")
        return LogprobParams(bool(self.logprobs), -1, self.top_logprobs or 0)


class CompletionBody(SamplingFields):
    prompt: str | list[str] | list[int] | list[list[int]]
    max_tokens: int | None = 16  # OpenAI's default for completions
    logprobs: int | None = None  # how many alternatives per token (0: only the chosen token's)
    echo: bool = False  # the prompt comes back before the completion (with its log-probs when logprobs is set)

    def logprob_params(self) -> LogprobParams:
        if self.logprobs is None:
            return LogprobParams()
        if self.logprobs < 0:
            raise InvalidRequestError(f"logprobs={self.logprobs}: must be >= 0")
        return LogprobParams(True, 0 if self.echo else -1, self.logprobs)


MAX_N = 16
UNSUPPORTED_CHAT = ("logit_bias", "functions", "function_call", "audio", "modalities", "prediction",
                    "store", "metadata", "service_tier", "reasoning_effort", "web_search_options")
UNSUPPORTED_COMPLETION = ("best_of", "suffix", "logit_bias")


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
    seed = body.seed if body.seed is not None else body.sampling_seed
    if seed is not None and seed + body.n - 1 > SEED_MAX:
        raise InvalidRequestError(f"seed={seed}: choice j samples with seed + j, which must fit in 64 bits "
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
    seed = body.seed if body.seed is not None else body.sampling_seed
    if seed is not None:
        params["seed"] = seed + choice
    for name in ("skip_special_tokens", "spaces_between_special_tokens", "no_stop_trim"):
        if getattr(body, name) is not None:
            params[name] = getattr(body, name)
    if body.stop_token_ids is not None:
        params["stop_token_ids"] = list(body.stop_token_ids)
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


def openai_retention(retention: str | None, cache_key: str | None) -> Retention | None:
    """OpenAI's `prompt_cache_retention` ("in_memory": minutes, "24h"), or a `prompt_cache_key`
    conversation (kept a few minutes): the whole sequence, prompt and output, is retained."""
    if retention is not None:
        return Retention.whole(Retention.named(retention, "prompt_cache_retention"))
    if cache_key is not None:
        return Retention.whole(CONVERSATION_SECONDS)
    return None
