"""ForwardBatch: what one model forward computes, as the attention backends see it.

A forward either *extends* requests (runs new prompt tokens after a cached prefix; prefill is an
extend with an empty prefix) or *decodes* (one new token per request). New tokens of all
requests are flattened into one token dimension `T`; per-request descriptors locate them.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import torch


class ForwardMode(enum.Enum):
    EXTEND = "extend"
    DECODE = "decode"


@dataclass(frozen=True)
class ForwardBatch:
    mode: ForwardMode
    input_ids: torch.Tensor  # (T,) int64 new tokens, request after request
    positions: torch.Tensor  # (T,) int64 absolute position of each new token
    req_pool_indices: torch.Tensor  # (B,) int64 rows of req_to_token
    seq_lens: torch.Tensor  # (B,) int32 KV length after this forward (prefix + new)
    prefix_lens: torch.Tensor  # (B,) int32 tokens already in the KV cache
    extend_start_loc: torch.Tensor  # (B,) int32 offset of each request's new tokens in T
    out_cache_loc: torch.Tensor  # (T,) int64 KV slots where the new tokens are stored
    logits_index: torch.Tensor  # (N,) int64 rows of T whose logits are returned
    max_extend_len: int  # most new tokens of one request
    max_seq_len: int  # longest seq_len

    @property
    def batch_size(self) -> int:
        return int(self.req_pool_indices.shape[0])

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[0])

    @classmethod
    def build(
        cls,
        mode: ForwardMode,
        token_ids: list[list[int]],
        req_rows: list[int],
        prefix_lens: list[int],
        out_cache_loc: list[int] | torch.Tensor,
        device: torch.device | str = "cpu",
        logits: str | list[int] = "last",
    ) -> ForwardBatch:
        """Build from Python lists: `token_ids[b]` are request b's new tokens, which start at
        position `prefix_lens[b]` and are stored at `out_cache_loc` (flattened in the same order).

        `logits`: "last" (each request's last new token; what generation needs), "all", or the
        rows of the flattened tokens themselves. Every index goes to the device in one copy.
        """
        if not (len(token_ids) == len(req_rows) == len(prefix_lens)) or not token_ids:
            raise ValueError("token_ids, req_rows and prefix_lens must be equally long, non-empty")
        extend_lens = [len(t) for t in token_ids]
        if min(extend_lens) < 1:
            raise ValueError("every request in a forward needs at least one new token")
        if mode is ForwardMode.DECODE and max(extend_lens) != 1:
            raise ValueError("a decode forward takes exactly one new token per request")
        flat = [t for toks in token_ids for t in toks]
        positions = [p for pre, n in zip(prefix_lens, extend_lens) for p in range(pre, pre + n)]
        starts, acc = [], 0
        for n in extend_lens:
            starts.append(acc)
            acc += n
        if logits == "last":
            index = [s + n - 1 for s, n in zip(starts, extend_lens)]
        elif logits == "all":
            index = list(range(acc))
        elif isinstance(logits, list):
            index = logits
        else:
            raise ValueError(f"logits must be 'last', 'all' or a list of rows, got {logits!r}")
        seq_lens = [pre + n for pre, n in zip(prefix_lens, extend_lens)]
        loc = out_cache_loc.tolist() if isinstance(out_cache_loc, torch.Tensor) else out_cache_loc
        if len(loc) != acc:
            raise ValueError(f"{len(loc)} KV slots given for {acc} new tokens")
        parts = (flat, positions, req_rows, seq_lens, prefix_lens, starts, loc, index)
        host = torch.tensor([v for part in parts for v in part], dtype=torch.int64)  # every index, one buffer
        device = torch.device(device)
        if device.type == "cuda":
            host = host.pin_memory()
        ids, pos, rows, lens, prefix, start_loc, slots, logit_rows = host.to(device, non_blocking=True).split(
            [len(p) for p in parts])
        return cls(
            mode=mode,
            input_ids=ids,
            positions=pos,
            req_pool_indices=rows,
            seq_lens=lens.to(torch.int32),
            prefix_lens=prefix.to(torch.int32),
            extend_start_loc=start_loc.to(torch.int32),
            out_cache_loc=slots,
            logits_index=logit_rows,
            max_extend_len=max(extend_lens),
            max_seq_len=max(seq_lens),
        )
