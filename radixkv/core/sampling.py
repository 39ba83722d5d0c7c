"""After a forward, on the executor's side: prompt log-probs, grammar masks, sampling, output
log-probs and the verification of drafts. Reads the requests (their parameters, output so far,
grammar state) and changes none of them except to give a seeded request its generator; what
the tokens mean for each request (appending them, the stop rules, jump-forward) is the
scheduler's (`radixkv.sched.postprocess`).
"""

from __future__ import annotations

import time

import torch

from radixkv.core.batch import ScheduledBatch
from radixkv.model.sampler import Sampler, SamplingRow
from radixkv.sched.logprobs import token_logprobs
from radixkv.sched.records import Sample
from radixkv.sched.request import Req
from radixkv.sched.stats import SchedulerStats
from radixkv.sched.stop import suppressed_ids


class Sampling:
    """Turns a forward's logits into each row's `Sample` and prompt log-probs."""

    def __init__(self, sampler: Sampler, eos_ids: frozenset[int], vocab_size: int, stats: SchedulerStats):
        self.sampler, self.eos_ids, self.vocab_size, self.stats = sampler, eos_ids, vocab_size, stats

    def process(self, batch: ScheduledBatch, logits: torch.Tensor
                ) -> tuple[list[Sample | None], list[dict[int, tuple[float, list | None]] | None]]:
        """logits (N, V): the rows `batch.layout` names -> per batch row, its sample (None when it
        samples nothing) and the prompt log-probs it scored (None when none)."""
        samples: list[Sample | None] = [None] * len(batch.rows)
        prompts: list[dict[int, tuple[float, list | None]] | None] = [None] * len(batch.rows)
        sampling, sample_rows, where = [], [], []
        for b, (row, lay) in enumerate(zip(batch.rows, batch.layout)):
            if lay.prompt:
                prompts[b] = self._prompt_logprobs(row.req, logits[lay.prompt[0]: lay.prompt[-1] + 1], lay.positions)
            if lay.sample is not None and lay.drafts:
                samples[b] = self._verify(row.req, row.draft, logits[lay.sample: lay.sample + lay.drafts + 1])
            elif lay.sample is not None:
                sampling.append(row.req)
                sample_rows.append(lay.sample)
                where.append(b)
        if not sampling:
            return samples, prompts
        if not batch.all_samples:  # some rows were prompt log-probs or drafts: keep the sampling rows
            logits = logits[torch.tensor(sample_rows, dtype=torch.int64, device=logits.device)]
        wants = [i for i, r in enumerate(sampling) if r.logprob.return_logprob and r.params.max_new_tokens]
        raw = logits[wants].clone() if wants else None  # the model's own distribution, before sampling edits it
        self._apply_grammars(sampling, logits)
        rows = [SamplingRow(r.params, self._generator(r), r.output_ids, r.prompt_ids, suppressed_ids(r, self.eos_ids))
                for r in sampling]
        tokens = self.sampler.sample(logits, rows)
        for b, token in zip(where, tokens):
            samples[b] = Sample([token])
        if wants:
            top_n = max(sampling[i].logprob.top_n for i in wants)
            lps, tops = token_logprobs(raw, [tokens[i] for i in wants], top_n)
            for k, i in enumerate(wants):
                sample = samples[where[i]]
                sample.logprobs = [lps[k]]
                if sampling[i].logprob.top_n:
                    sample.top_logprobs = [tops[k][: sampling[i].logprob.top_n]]
        return samples, prompts

    def _generator(self, req: Req) -> torch.Generator | None:
        """The request's own generator when it carries a seed (made at its first sample)."""
        if req.generator is None and req.params.seed is not None:
            req.generator = Sampler.request_generator(req.params.seed, self.sampler.device)
        return req.generator

    def _verify(self, req: Req, draft: list[int], logits: torch.Tensor) -> Sample:
        """The drafts the target agrees with, plus its own next token (`Sampler.verify`), with the
        log-probs of each when asked. logits (k + 1, V)."""
        base = list(req.output_ids)
        generator = self._generator(req)

        def row_at(i: int) -> SamplingRow:
            return SamplingRow(req.params, generator, base + draft[:i], req.prompt_ids,
                               suppressed_ids(req, self.eos_ids, ahead=i))

        raw = logits.clone() if req.logprob.return_logprob else None  # before masks edit it
        grammar, advanced = req.grammar, [0]

        def mask_at(i: int, lg: torch.Tensor) -> None:  # the grammar's state after draft[:i]
            from radixkv.constrained import allocate_mask, apply_mask

            while advanced[0] < i and grammar.accept(draft[advanced[0]]):  # drafts were cut to what it allows
                advanced[0] += 1
            mask = allocate_mask(1, self.vocab_size)
            grammar.fill_mask(mask, 0)
            apply_mask(lg, mask, [0])

        kept = self.sampler.verify(logits, draft, row_at, mask_at if grammar is not None else None)
        if grammar is not None:
            grammar.rollback(advanced[0])  # the scheduler accepts what it takes, as decoding would
        sample = Sample(kept)
        if raw is not None and req.params.max_new_tokens:
            sample.logprobs, sample.top_logprobs = [], [] if req.logprob.top_n else None
            for i, token in enumerate(kept):  # one row at a time, as a decode step scores it
                lps, tops = token_logprobs(raw[i: i + 1], [token], req.logprob.top_n)
                sample.logprobs.append(lps[0])
                if req.logprob.top_n:
                    sample.top_logprobs.append(tops[0][: req.logprob.top_n])
        return sample

    def _prompt_logprobs(self, req: Req, logits: torch.Tensor, positions: list[int]
                         ) -> dict[int, tuple[float, list | None]]:
        """logits (n, V) at `positions` score the prompt tokens one position later."""
        lps, tops = token_logprobs(logits, [req.prompt_ids[p + 1] for p in positions], req.logprob.top_n)
        return {p + 1: (lps[k], tops[k] if tops else None) for k, p in enumerate(positions)}

    def _apply_grammars(self, sampling: list[Req], logits: torch.Tensor) -> None:
        """Mask the logits (N, V) of constrained rows to the tokens their grammar allows next.

        Masks are filled on this thread after the forward: at about 3-20 µs a row they cost
        well under 1 % of a CPU forward, so overlapping them with it would not pay here."""
        rows = [i for i, r in enumerate(sampling) if r.grammar is not None and r.params.max_new_tokens]
        if not rows:
            return
        from radixkv.constrained import allocate_mask, apply_mask

        start = time.perf_counter()
        mask = allocate_mask(len(sampling), self.vocab_size)  # (N, ceil(V / 32)) int32 bits
        for i in rows:
            sampling[i].grammar.fill_mask(mask, i)
        apply_mask(logits, mask, rows)
        self.stats.grammar_mask_seconds += time.perf_counter() - start
