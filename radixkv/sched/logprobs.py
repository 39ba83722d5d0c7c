"""Log-probabilities a request asks for: of its output tokens, and of its prompt tokens from a
start position (what `select` ranks choices by).

Prompt log-probs need the logits at positions `start - 1 .. len(prompt) - 2` (the logits at
position p score token p + 1), so a request that wants them matches the prefix cache only up to
`start - 1` tokens: a cached prefix before that is reused, nothing after it is skipped. The
values are the model's own distribution (log-softmax of the raw logits, before penalties,
temperature or filters), as SGLang and vLLM report them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from radixkv.sampling_params import LogprobParams


@dataclass
class LogprobState:
    """A request's log-probs so far: output tokens in order, prompt tokens by position."""

    output: list[float] = field(default_factory=list)
    output_top: list[list[list]] = field(default_factory=list)  # per token: [[logprob, token_id], ...]
    prompt: dict[int, tuple[float, list | None]] = field(default_factory=dict)  # position -> (lp, top)
    prompt_sent: bool = False


def prompt_rows(params: LogprobParams, prompt_len: int, first: int, count: int) -> list[int]:
    """Offsets, within a chunk of `count` tokens starting at position `first`, whose logits score
    a prompt token (position p scores token p + 1) the request asked about."""
    if not params.wants_prompt:
        return []
    lo = max(first, params.start - 1)
    hi = min(first + count, prompt_len - 1)  # the last prompt position's logits sample the output
    return list(range(lo - first, hi - first)) if hi > lo else []


@torch.inference_mode()
def token_logprobs(logits: torch.Tensor, token_ids: list[int], top_n: int) -> tuple[list[float], list[list] | None]:
    """logits (n, V) -> the log-prob of `token_ids[i]` under row i, and each row's `top_n`
    most likely [logprob, token_id] pairs (None when top_n is 0)."""
    logp = torch.log_softmax(logits.float(), dim=-1)  # (n, V)
    ids = torch.tensor(token_ids, dtype=torch.int64, device=logits.device)
    chosen = logp.gather(1, ids[:, None])[:, 0].tolist()  # (n,)
    if not top_n:
        return chosen, None
    values, indices = logp.topk(top_n, dim=-1)  # (n, k)
    top = [[[v, i] for v, i in zip(row_v, row_i)] for row_v, row_i in zip(values.tolist(), indices.tolist())]
    return chosen, top
