"""SamplingParams: how one request's tokens are chosen and when it stops, validated on creation."""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from radixkv.errors import InvalidRequestError

MAX_NEW_TOKENS_LIMIT = 1 << 20
GREEDY_TEMPERATURE = 1e-5
MAX_TOP_LOGPROBS = 20
MAX_STOP_REGEX_CHARS = 4096
ALIASES = {"sampling_seed": "seed"}  # SGLang's names for ours
HINTS = ("stream_interval",)  # SGLang's: how often a stream sends (here: every step's tokens); no effect on output
SEED_MIN, SEED_MAX = 0, (1 << 64) - 1  # what a torch generator takes (OpenAI, vLLM: a non-negative seed)


def shown(value: Any, limit: int = 80) -> str:
    """`value` as a message quotes it: its repr, cut short when long."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


@dataclass(frozen=True)
class SamplingParams:
    """Per-request sampling and stopping (the SGLang / OpenAI meanings).

    `temperature < 1e-5` (e.g. 0) or `top_k == 1` is greedy decoding. `top_k <= 0` and `top_p == 1`
    disable those filters. Penalties follow OpenAI (`frequency_penalty`, `presence_penalty`:
    subtracted per occurrence / once, over generated tokens) and HF (`repetition_penalty`:
    divides positive logits of prompt and generated tokens, multiplies negative ones).

    At most one of `regex`, `json_schema` (a dict or JSON text) and `ebnf` constrains the output
    to a grammar (see `radixkv.grammar_spec` and `radixkv.constrained`); `from_dict` (a user's
    request) also checks its syntax. `jump_forward` appends the text a grammar forces in one
    extend instead of decoding it token by token.
    """

    max_new_tokens: int = 128
    min_new_tokens: int = 0
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    repetition_penalty: float = 1.0
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True  # passed to the tokenizer's decode (fast tokenizers ignore it)
    no_stop_trim: bool = False  # keep the stop string that ended generation in the text
    stop_regex: tuple[str, ...] = ()  # stop once the output text matches one of these patterns
    regex: str | None = None
    json_schema: str | None = None
    ebnf: str | None = None
    jump_forward: bool = True
    extra: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        def bad(name: str, why: str) -> InvalidRequestError:
            return InvalidRequestError(f"sampling_params.{name}={shown(getattr(self, name))}: {why}")

        for name in ("stop", "stop_token_ids", "stop_regex"):
            if not isinstance(getattr(self, name), (tuple, list)):
                raise bad(name, "must be a list")
        for name in ("max_new_tokens", "min_new_tokens", "top_k"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int):
                raise bad(name, "must be an integer")
        if self.top_k < -1:
            raise bad("top_k", "must be -1 or 0 (off) or a positive number of tokens")
        if not 0 <= self.max_new_tokens <= MAX_NEW_TOKENS_LIMIT:
            raise bad("max_new_tokens", f"must be in [0, {MAX_NEW_TOKENS_LIMIT}]")
        if not 0 <= self.min_new_tokens <= self.max_new_tokens:
            raise bad("min_new_tokens", "must be in [0, max_new_tokens]")
        for name, lo, hi in (("temperature", 0.0, 100.0), ("top_p", 0.0, 1.0), ("min_p", 0.0, 1.0),
                             ("frequency_penalty", -2.0, 2.0), ("presence_penalty", -2.0, 2.0),
                             ("repetition_penalty", 0.0, 10.0)):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or v != v:
                raise bad(name, "must be a number")
            if not lo <= v <= hi:
                raise bad(name, f"must be in [{lo}, {hi}]")
        if self.top_p == 0:
            raise bad("top_p", "must be > 0 (use temperature=0 for greedy)")
        if self.repetition_penalty == 0:
            raise bad("repetition_penalty", "must be > 0")
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, int)):
            raise bad("seed", "must be an integer or None")
        if self.seed is not None and not SEED_MIN <= self.seed <= SEED_MAX:
            raise bad("seed", f"must be in [{SEED_MIN}, {SEED_MAX}] (a non-negative 64-bit integer)")
        if not all(isinstance(s, str) and s for s in self.stop):
            raise bad("stop", "must be non-empty strings")
        if not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in self.stop_token_ids):
            raise bad("stop_token_ids", "must be non-negative integers")
        for name in ("skip_special_tokens", "spaces_between_special_tokens", "no_stop_trim", "ignore_eos"):
            if not isinstance(getattr(self, name), bool):
                raise bad(name, "must be true or false")
        self._check_stop_regex(bad)
        self._check_grammar(bad)

    def _check_stop_regex(self, bad) -> None:
        if not all(isinstance(s, str) and s for s in self.stop_regex):
            raise bad("stop_regex", "must be non-empty strings")
        if sum(map(len, self.stop_regex)) > MAX_STOP_REGEX_CHARS:
            raise bad("stop_regex", f"more than {MAX_STOP_REGEX_CHARS} characters of patterns")
        for pattern in self.stop_regex:
            try:
                compiled = re.compile(pattern)
            except (re.error, RecursionError, OverflowError) as e:
                raise bad("stop_regex", f"{shown(pattern)} is not a regular expression: {e}") from None
            if compiled.search(""):
                raise bad("stop_regex", f"{shown(pattern)} matches the empty text: it would stop at once")

    def _check_grammar(self, bad) -> None:
        from radixkv.grammar_spec import GRAMMAR_FIELDS, MAX_GRAMMAR_CHARS, GrammarSpec, normalise_json_schema

        given = [name for name in GRAMMAR_FIELDS if getattr(self, name) is not None]
        if len(given) > 1:
            raise InvalidRequestError(f"sampling_params: give at most one of {list(GRAMMAR_FIELDS)}, got {given}")
        if not isinstance(self.jump_forward, bool):
            raise bad("jump_forward", "must be true or false")
        if not given:
            return
        if self.json_schema is not None:  # canonical text: the compiled-grammar cache key
            object.__setattr__(self, "json_schema", normalise_json_schema(self.json_schema))
        for name in ("regex", "ebnf"):
            if getattr(self, name) is not None and (not isinstance(getattr(self, name), str) or not getattr(self, name)):
                raise bad(name, "must be a non-empty string")
        if self.ignore_eos:
            raise bad("ignore_eos", f"cannot be combined with {given[0]}: a finished grammar ends on EOS")
        spec = GrammarSpec.of(self)
        if len(spec.source) > MAX_GRAMMAR_CHARS:
            raise bad(spec.kind, f"{len(spec.source)} characters, more than the {MAX_GRAMMAR_CHARS} accepted")

    @property
    def grammar(self):
        """The `GrammarSpec` this request is constrained by, or None."""
        from radixkv.grammar_spec import GrammarSpec

        return GrammarSpec.of(self)

    @property
    def greedy(self) -> bool:
        """Argmax decoding: temperature below 1e-5 (dividing by it would overflow) or top_k 1."""
        return self.temperature < GREEDY_TEMPERATURE or self.top_k == 1

    @property
    def has_penalties(self) -> bool:
        return bool(self.frequency_penalty or self.presence_penalty or self.repetition_penalty != 1.0)

    @classmethod
    def from_dict(cls, params: dict[str, Any] | SamplingParams | None) -> SamplingParams:
        """From a user dict; unknown keys are an error naming them."""
        if params is None:
            return cls()
        if isinstance(params, SamplingParams):
            return params
        if not isinstance(params, dict):
            raise InvalidRequestError(f"sampling_params must be a dict, got {type(params).__name__}")
        params = dict(params)
        for theirs, ours in ALIASES.items():
            if theirs in params:
                if params.get(ours) is not None and params[theirs] is not None:
                    raise InvalidRequestError(f"sampling_params: give {ours} or {theirs} (its alias), not both")
                value = params.pop(theirs)
                params.setdefault(ours, value)
        for name in HINTS:
            params.pop(name, None)
        known = {f.name for f in fields(cls)} - {"extra"}
        unknown = sorted(set(params) - known)
        if unknown:
            raise InvalidRequestError(
                f"unknown sampling_params {unknown}; accepted: {sorted(known)}"
            )
        params = {k: v for k, v in params.items() if v is not None}  # null: the default (SGLang's reading)
        for name in ("stop", "stop_regex"):
            if isinstance(params.get(name), str):
                params[name] = [params[name]]
        for name in ("stop", "stop_token_ids", "stop_regex"):
            if isinstance(params.get(name), list):
                params[name] = tuple(params[name])
        try:
            made = cls(**params)
        except TypeError as e:
            raise InvalidRequestError(f"sampling_params: {e}") from None
        spec = made.grammar
        if spec is not None:  # its syntax: a bad pattern fails where the request is made
            spec.check()
        return made

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("extra")
        return d

    def to_row(self) -> list:
        """The fields in order (what a message carries; `from_row` rebuilds it)."""
        return [getattr(self, f.name) for f in fields(self)]

    @classmethod
    def from_row(cls, row: list) -> SamplingParams:
        values = dict(zip((f.name for f in fields(cls)), row, strict=True))
        for name in ("stop", "stop_token_ids", "stop_regex"):  # lists on the wire
            values[name] = tuple(values[name])
        return cls(**values)


@dataclass(frozen=True, slots=True)
class LogprobParams:
    """`return_logprob`: report output token log-probs; `start` >= 0: also prompt tokens from
    that position; `top_n`: that many most likely alternatives at each reported position."""

    return_logprob: bool = False
    start: int = -1
    top_n: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.return_logprob, bool):
            raise InvalidRequestError(f"return_logprob={self.return_logprob!r}: must be true or false")
        for name in ("start", "top_n"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int):
                raise InvalidRequestError(f"{'logprob_start_len' if name == 'start' else 'top_logprobs_num'}="
                                          f"{v!r}: must be an integer")
        if self.start < -1:
            raise InvalidRequestError(f"logprob_start_len={self.start}: must be -1 (no prompt log-probs) or a "
                                      f"prompt position >= 0")
        if not 0 <= self.top_n <= MAX_TOP_LOGPROBS:
            raise InvalidRequestError(f"top_logprobs_num={self.top_n}: must be in [0, {MAX_TOP_LOGPROBS}]")
        if (self.start >= 0 or self.top_n) and not self.return_logprob:
            raise InvalidRequestError("logprob_start_len and top_logprobs_num need return_logprob=true")

    def check_prompt(self, prompt_len: int) -> None:
        if self.start > prompt_len:
            raise InvalidRequestError(f"logprob_start_len={self.start} is past the prompt ({prompt_len} tokens)")

    @property
    def wants_prompt(self) -> bool:
        return self.return_logprob and self.start >= 0
