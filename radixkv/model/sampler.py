"""Sampler: next-token choice for a batch of requests, each with its own SamplingParams.

Greedy rows take the argmax. Sampled rows apply temperature, then top-k, top-p and min-p
filters, and draw from the renormalised distribution with the request's own generator when it
has a seed (so a seeded request samples the same tokens whatever it is batched with) or with
the sampler's shared generator otherwise. Penalties are applied first, to the raw logits.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from radixkv.sampling_params import SamplingParams


@dataclass(slots=True)
class SamplingRow:
    """One request's view for a sampling step."""

    params: SamplingParams
    generator: torch.Generator | None = None  # the request's own, when it has a seed
    output_ids: list[int] | None = None  # generated so far (for penalties)
    prompt_ids: list[int] | None = None  # (for repetition_penalty)
    suppress_ids: tuple[int, ...] = ()  # e.g. EOS before min_new_tokens


class Sampler:
    def __init__(self, device: torch.device | str = "cpu", seed: int = 0):
        self.device = torch.device(device)
        self.generator = torch.Generator(device=self.device)
        self.generator.manual_seed(seed)

    @staticmethod
    def request_generator(seed: int, device: torch.device | str = "cpu") -> torch.Generator:
        gen = torch.Generator(device=torch.device(device))
        gen.manual_seed(seed)
        return gen

    @torch.inference_mode()
    def sample(self, logits: torch.Tensor, rows: list[SamplingRow]) -> list[int]:
        """logits (B, V) float32 -> one token id per row (the model's logits are inference
        tensors, so penalties and suppression edit them inside inference mode too)."""
        assert logits.shape[0] == len(rows), "one SamplingRow per logits row"
        logits = logits.float()
        for i, row in enumerate(rows):
            edit_row(logits, i, row)
        best = logits.argmax(dim=-1)  # (B,) greedy for everyone; sampled rows overwrite
        # a row with no allowed token (all -inf, or NaN: argmax picks it) cannot be sampled: it
        # keeps the argmax, which its caller rejects, and the batch goes on. Read at the argmax
        # alone: a pass over every logit cost 0.4 ms of a batch-8 decode step.
        alive = logits.gather(1, best[:, None])[:, 0] > float("-inf")  # (B,)
        out, alive = torch.stack((best, alive.to(best.dtype))).tolist()  # one copy to the host
        sampled = [i for i, r in enumerate(rows) if not r.params.greedy and alive[i]]
        if sampled:
            probs = filtered_probs(logits[sampled], [rows[i].params for i in sampled])  # (S, V)
            for j, i in enumerate(sampled):
                gen = rows[i].generator or self.generator
                out[i] = int(torch.multinomial(probs[j], 1, generator=gen))
        return out


    @torch.inference_mode()
    def verify(self, logits: torch.Tensor, draft: list[int], row_at, mask_at=None) -> list[int]:
        """Check one request's draft tokens against the target's logits; the tokens it keeps.

        logits (k + 1, V): row i scores the token after `draft[:i]`; `row_at(i)` is the
        request's `SamplingRow` at that point (its output so far plus `draft[:i]`, for penalties
        and suppression); `mask_at(i, lg)`, if given, masks lg (1, V) in place to the tokens a
        grammar allows after `draft[:i]`. Greedy: a draft is kept while it is the target's argmax. Sampling
        (the speculative-sampling rule for a deterministic draft): draft d is kept with the
        target's probability p(d); on a rejection the token is drawn from p with d removed,
        renormalised; so each kept token has the target's distribution. Returns the kept
        drafts and one more token (the correction, or the bonus after the last draft).
        """
        out: list[int] = []
        for i in range(len(draft) + 1):
            row = row_at(i)
            lg = logits[i: i + 1].float().clone()  # (1, V)
            edit_row(lg, 0, row)
            if mask_at is not None:
                mask_at(i, lg)
            proposed = draft[i] if i < len(draft) else None
            gen = row.generator or self.generator
            if row.params.greedy or not torch.isfinite(lg).any():
                token = int(lg.argmax())
            else:
                probs = filtered_probs(lg, [row.params])[0]  # (V,)
                if proposed is not None:
                    if float(torch.rand((), generator=gen, device=probs.device)) < float(probs[proposed]):
                        out.append(proposed)
                        continue
                    probs = probs.clone()
                    probs[proposed] = 0.0
                    if float(probs.sum()) <= 0:  # p(d) was 1: a rejection cannot happen
                        out.append(proposed)
                        continue
                token = int(torch.multinomial(probs / probs.sum(), 1, generator=gen))
            out.append(token)
            if token != proposed:
                break
        return out


def edit_row(logits: torch.Tensor, i: int, row: SamplingRow) -> None:
    """Apply `row`'s penalties and suppressed tokens to logits[i] (V,), in place."""
    if row.params.has_penalties:
        logits[i] = apply_penalties(logits[i], row)
    if row.suppress_ids:
        logits[i, list(row.suppress_ids)] = float("-inf")


def filtered_probs(logits: torch.Tensor, params: list[SamplingParams]) -> torch.Tensor:
    """logits (S, V) -> probabilities (S, V) after temperature, top-k, top-p and min-p."""
    dev = logits.device
    temp = torch.tensor([p.temperature for p in params], device=dev)[:, None]  # (S, 1)
    logits = logits / temp
    top_k = [p.top_k for p in params]
    if any(k > 0 for k in top_k):
        vocab = logits.shape[-1]
        k = torch.tensor([min(k, vocab) if k > 0 else vocab for k in top_k], device=dev)  # (S,)
        kth = logits.sort(dim=-1, descending=True).values.gather(1, (k - 1)[:, None])  # (S, 1)
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = logits.softmax(dim=-1)  # (S, V)
    top_p = torch.tensor([p.top_p for p in params], device=dev)[:, None]  # (S, 1)
    if (top_p < 1).any():
        sorted_p, order = probs.sort(dim=-1, descending=True)  # (S, V)
        # drop a token when the mass before it already reaches top_p (always keep the first)
        drop = (sorted_p.cumsum(dim=-1) - sorted_p) >= top_p  # (S, V)
        sorted_p = sorted_p.masked_fill(drop, 0.0)
        probs = torch.zeros_like(probs).scatter(1, order, sorted_p)
    min_p = torch.tensor([p.min_p for p in params], device=dev)[:, None]  # (S, 1)
    if (min_p > 0).any():
        probs = probs.masked_fill(probs < min_p * probs.max(dim=-1, keepdim=True).values, 0.0)
    return probs / probs.sum(dim=-1, keepdim=True)


def apply_penalties(logits: torch.Tensor, row: SamplingRow) -> torch.Tensor:
    """logits (V,) -> penalised logits (V,)."""
    p = row.params
    out = list(row.output_ids or ())
    if p.repetition_penalty != 1.0:
        seen = torch.tensor(sorted(set(out) | set(row.prompt_ids or ())), dtype=torch.long,
                            device=logits.device)
        if seen.numel():
            vals = logits[seen]
            logits[seen] = torch.where(vals > 0, vals / p.repetition_penalty, vals * p.repetition_penalty)
    if out and (p.frequency_penalty or p.presence_penalty):
        counts = torch.bincount(torch.tensor(out, device=logits.device), minlength=logits.shape[0])
        counts = counts[: logits.shape[0]].to(logits.dtype)  # (V,)
        logits = logits - p.frequency_penalty * counts - p.presence_penalty * (counts > 0).to(logits.dtype)
    return logits
