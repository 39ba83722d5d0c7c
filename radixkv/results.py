"""How a request's outputs add up to its result: token ids and, when asked for, log-probs.

Torch-free: the Engine (in-process) and the server's HTTP process (from the detokenizer's
messages) build the same `meta_info` with it. Log-probs are `[logprob, token_id]` pairs; top
alternatives are lists of such pairs; the first prompt token has no log-prob (None).
"""

from __future__ import annotations

from typing import Any


class Collected:
    """One request's outputs so far (anything with `new_ids`, `output_logprobs`,
    `output_top_logprobs`, `input_logprobs`, `input_top_logprobs`)."""

    def __init__(self) -> None:
        self.ids: list[int] = []
        self.output_logprobs: list[float] = []
        self.output_top: list[list] = []
        self.input_logprobs: list[list] | None = None
        self.input_top: list | None = None

    def add(self, out) -> None:
        self.ids.extend(out.new_ids)
        self.output_logprobs.extend(out.output_logprobs or ())
        self.output_top.extend(out.output_top_logprobs or ())
        if out.input_logprobs is not None:
            self.input_logprobs, self.input_top = out.input_logprobs, out.input_top_logprobs

    def logprob_meta(self, return_logprob: bool, start: int, top_n: int) -> dict[str, Any]:
        """The log-prob entries of `meta_info` (none unless `return_logprob`)."""
        if not return_logprob:
            return {}
        meta: dict[str, Any] = {"output_token_logprobs": [[v, t] for v, t in zip(self.output_logprobs, self.ids)],
                                "output_token_logprobs_length": len(self.output_logprobs)}
        if top_n:
            meta["output_top_logprobs"] = self.output_top
        if start >= 0:
            meta["input_token_logprobs"] = self.input_logprobs or []
            if top_n:
                meta["input_top_logprobs"] = self.input_top or []
        return meta
