"""The `draft` proposer: a smaller model with the same tokenizer drafts tokens greedily.

The draft model runs through the same machinery as the target: its own `ModelRunner`, KV pool
and radix cache (`RequestKV` over them), so a request's prefix hits in the draft's cache as it
does in the target's. Each step, every speculating request gets a shadow request on the draft
side whose prompt is its whole sequence so far: one batched extend computes what the draft's
cache lacks (usually the one token the target just added) and scores the first draft token,
then `k - 1` batched decode steps draft the rest. The shadow's drafted tokens are then rolled
back and its real sequence cached, so the draft cache only ever holds text the request has.
"""

from __future__ import annotations

import logging

import torch

from radixkv.attention import ForwardMode
from radixkv.config import EngineConfig
from radixkv.errors import ConfigError
from radixkv.mem import make_prefix_cache
from radixkv.sampling_params import SamplingParams
from radixkv.sched.kv import RequestKV
from radixkv.sched.request import Req

logger = logging.getLogger(__name__)


class DraftModelProposer:
    """Drafts for a batch of requests from a second model (see the module docstring)."""

    name = "draft"

    def __init__(self, runner, max_k: int):
        self.runner = runner
        self.cache = make_prefix_cache(runner.memory.allocator, "lru", runner.model_config.attention_scale)
        self.kv = RequestKV(runner.memory, self.cache, retract_decode_steps=max_k)
        self.forwards = 0  # draft-model forwards run (stats)

    @classmethod
    def load(cls, config: EngineConfig, target) -> DraftModelProposer:
        """Load `config.spec.speculative_draft_model_path` beside the target runner `target`."""
        from radixkv.model.runner import ModelRunner

        draft_config = config.with_options(model=config.spec.speculative_draft_model_path, speculative_algorithm=None,
            speculative_draft_model_path=None, host_kv_size=None, timeline_file=None,
            max_total_tokens=config.cache.max_total_tokens or None)
        runner = ModelRunner.load(draft_config, progress=False)
        if runner.model_config.vocab_size > target.model_config.vocab_size:
            raise ConfigError(
                f"speculative_draft_model_path={config.spec.speculative_draft_model_path!r}: its vocabulary "
                f"({runner.model_config.vocab_size}) is larger than the target's "
                f"({target.model_config.vocab_size}); the draft model must share the target's tokenizer")
        logger.info("draft model %s: %d layers, KV pool %d tokens", runner.model_config.architecture,
                    runner.model_config.num_layers, runner.memory.total_tokens)
        return cls(runner, config.spec.speculative_num_draft_tokens)

    def propose(self, req: Req, k: int) -> list[int]:
        return self.propose_batch([(req, k)]).get(req.rid, [])

    @torch.inference_mode()
    def propose_batch(self, asks: list[tuple[Req, int]]) -> dict[str, list[int]]:
        """Greedy drafts of at most k tokens for each (request, k)."""
        shadows, rows = [], []
        for req, k in asks:
            shadow = Req(f"draft:{req.rid}", req.seq_ids, SamplingParams(max_new_tokens=k), namespace=req.namespace)
            admitted = self.kv.admit(shadow, None, shadow.seq_len, 0)
            if admitted is None:  # the draft pool is full: this request decodes plainly this step
                continue
            shadows.append((req.rid, shadow, k))
            rows.append(admitted.row)
        if not shadows:
            return {}
        drafts = {rid: [] for rid, _, _ in shadows}
        try:
            self._run(rows, ForwardMode.EXTEND, shadows, drafts)
            for _ in range(max(k for _, _, k in shadows) - 1):
                live = [(rid, s, k) for rid, s, k in shadows if len(drafts[rid]) < k]
                if not live:
                    break
                step_rows = [self.kv.grow(s, 1) for _, s, _ in live]
                self._run(step_rows, ForwardMode.DECODE, live, drafts)
        finally:
            for _, shadow, _ in shadows:  # keep only the real sequence in the draft's cache
                extra = shadow.kv_len - len(shadow.prompt_ids)
                if extra > 0:
                    self.kv.rollback(shadow, extra)
                shadow.output_ids = []
                self.kv.release(shadow)
        return drafts

    def _run(self, rows, mode, shadows, drafts) -> None:
        fb = self.runner.build_batch(mode, [r.tokens for r in rows], [r.req.row for r in rows],
                                     [r.start for r in rows], [s for r in rows for s in r.slots])
        tokens = self.runner.forward(fb).argmax(-1).tolist()  # (B,) the draft's greedy next tokens
        self.forwards += 1
        for (rid, shadow, _), token in zip(shadows, tokens):
            drafts[rid].append(token)
            shadow.output_ids.append(token)

    def close(self) -> None:
        self.runner.close()
