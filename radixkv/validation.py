"""Whether a request could ever run: the checks shared by the scheduler and the HTTP server.

Torch-free, so the server's HTTP process can refuse a bad request (HTTP 400) before it crosses
a socket; the scheduler runs the same checks again on whatever reaches it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from radixkv.errors import InvalidRequestError
from radixkv.sampling_params import SamplingParams


@dataclass(frozen=True, slots=True)
class RequestLimits:
    """What a model and its KV pool allow, in tokens."""

    vocab_size: int
    context_length: int  # prompt + output tokens per request
    pool_tokens: int  # the KV pool's capacity
    page_size: int
    has_tokenizer: bool  # stop strings need one

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def check_token_ids(ids: list[int], vocab_size: int, field: str = "input_ids") -> None:
    """Raise `InvalidRequestError` naming `field[i]` unless every id is a token id of the model
    (before anything decodes them: the tokenizer fails on ids it does not hold)."""
    for i, t in enumerate(ids):
        if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < vocab_size:
            raise InvalidRequestError(f"{field}[{i}]={t!r} is not a token id in [0, {vocab_size})")


def check_request(input_ids: list[int], params: SamplingParams, limits: RequestLimits) -> None:
    """Raise `InvalidRequestError` naming the field if this request can never run."""
    vocab = limits.vocab_size
    if not isinstance(input_ids, list) or not input_ids:
        raise InvalidRequestError("the prompt is empty (no tokens)")
    check_token_ids(input_ids, vocab)
    total = len(input_ids) + params.max_new_tokens
    if total > limits.context_length:
        raise InvalidRequestError(
            f"prompt of {len(input_ids)} tokens + max_new_tokens={params.max_new_tokens} exceeds "
            f"the context length of {limits.context_length} tokens")
    pages = -(-total // limits.page_size)
    if pages * limits.page_size > limits.pool_tokens:
        raise InvalidRequestError(
            f"prompt of {len(input_ids)} tokens + max_new_tokens={params.max_new_tokens} needs more "
            f"KV than the whole pool holds ({limits.pool_tokens} tokens)")
    if params.top_k > vocab:
        raise InvalidRequestError(f"sampling_params.top_k={params.top_k}: must be at most the vocabulary size "
                                  f"{vocab} (or -1: every token)")
    for i, t in enumerate(params.stop_token_ids):
        if t >= vocab:
            raise InvalidRequestError(f"sampling_params.stop_token_ids[{i}]={t} is not a token id in [0, {vocab})")
    if params.stop and not limits.has_tokenizer:
        raise InvalidRequestError("stop strings need a tokenizer; this model has none")
