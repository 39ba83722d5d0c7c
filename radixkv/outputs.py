"""ReqOutput: what one request produced since its previous output, and where it stands. The one
definition of a request's output fields: the scheduler makes it, the IPC messages carry it, the
detokenizer adds text to it (`TextOutput`), the Engine and the HTTP server read it.

Torch-free, so every process can import it.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from radixkv.errors import ErrorKind, error_of_kind


@dataclass(frozen=True, slots=True)
class ReqOutput:
    """A request's state after a step: the tokens it produced since its previous output, and
    why it finished. `error` is set, with an `error_kind` (`radixkv.errors.ErrorKind`), when it
    ended without a result."""

    rid: str
    new_ids: list[int]
    finished: bool
    finish_reason: dict[str, Any] | None
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    ttft: float | None = None  # seconds from arrival to first token
    latency: float | None = None  # seconds from arrival to finish
    error: str | None = None
    error_kind: str | None = None  # an ErrorKind value
    # with return_logprob: the new output tokens' log-probs (and top alternatives, [[lp, id], ...]
    # per token); the prompt's [[lp, id], ...] from logprob_start_len, once, when prefilled
    output_logprobs: list[float] | None = None
    output_top_logprobs: list[list[list]] | None = None
    input_logprobs: list[list] | None = None
    input_top_logprobs: list[list[list] | None] | None = None
    spec_verify_ct: int = 0  # speculative decoding: forwards that verified drafts (SGLang's name)
    spec_accepted_tokens: int = 0  # draft tokens kept
    host_hit_tokens: int = 0  # of cached_tokens, copied back from the host tier
    storage_hit_tokens: int = 0  # of cached_tokens, read from the storage tier
    cache_causes: dict[str, int] | None = None  # the prompt split by cause (`radixkv.mem.miss_causes`)

    @classmethod
    def failed(cls, rid: str, message: str, kind: ErrorKind) -> ReqOutput:
        """The output of a request that ends before it ran."""
        return cls(rid=rid, new_ids=[], finished=True, finish_reason={"type": "abort", "message": message},
                   prompt_tokens=0, cached_tokens=0, completion_tokens=0, error=message, error_kind=kind)

    def meta_info(self) -> dict[str, Any]:
        """The `meta_info` of a result (SGLang's names)."""
        return {"id": self.rid, "prompt_tokens": self.prompt_tokens, "cached_tokens": self.cached_tokens,
                "completion_tokens": self.completion_tokens, "finish_reason": self.finish_reason,
                "ttft": self.ttft, "e2e_latency": self.latency, "spec_verify_ct": self.spec_verify_ct,
                "spec_accepted_tokens": self.spec_accepted_tokens,
                "cached_tokens_details": self.cached_tokens_details(), "cache": self.cache_causes}

    def cached_tokens_details(self) -> dict[str, int]:
        """Where the cached part of the prompt came from: the device pool, the host tier, storage."""
        return {"device": self.cached_tokens - self.host_hit_tokens - self.storage_hit_tokens,
                "host": self.host_hit_tokens, "storage": self.storage_hit_tokens}

    def raise_if_error(self) -> None:
        """Raise the typed error (`radixkv.errors.error_of_kind`) of a request that failed."""
        if self.error is not None:
            raise error_of_kind(self.error_kind or ErrorKind.INTERNAL, self.error)

    def to_row(self) -> list:
        """The fields in order, as plain values (what a message carries)."""
        return [getattr(self, name) for name in _field_names(type(self))]

    @classmethod
    def from_row(cls, row: list) -> ReqOutput:
        return cls(*row)


@dataclass(frozen=True, slots=True)
class TextOutput(ReqOutput):
    """A `ReqOutput` with the text its new tokens added (stop strings held back and trimmed)."""

    text: str = ""


_FIELD_NAMES: dict[type, tuple[str, ...]] = {}


def _field_names(cls: type) -> tuple[str, ...]:
    names = _FIELD_NAMES.get(cls)
    if names is None:
        names = _FIELD_NAMES[cls] = tuple(f.name for f in fields(cls))
    return names
