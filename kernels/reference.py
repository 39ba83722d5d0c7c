"""Torch reference implementations of the paged-attention kernels (same signatures).

They are the ground truth for the Triton kernels' tests and, being plain gathers plus SDPA, the
attention of the `torch` backend (the CPU default). Each attention function is a *plan* (gather
indices and masks, the same for every layer of one forward) plus an *apply*; the backend builds
the plan once per forward and applies it per layer. They compute in fp32 and return the input
dtype: exact enough to trust, and on CPU faster than bf16 matmuls.
"""

from dataclasses import dataclass

import torch
import torch.nn.functional as F


def store_kv(
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    out_cache_loc: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
) -> None:
    """Write `k`, `v` (T, H_kv, D) at KV slots `out_cache_loc` (T,), cast to the buffer dtype."""
    k_buffer[out_cache_loc] = k.to(k_buffer.dtype)  # (T, H_kv, D)
    v_buffer[out_cache_loc] = v.to(v_buffer.dtype)  # (T, H_kv, D)


def visible_mask(
    q_pos: torch.Tensor, kv_pos: torch.Tensor, sliding_window: int | None
) -> torch.Tensor:
    """Boolean (..., Tq, L) mask: query at position i sees kv position j iff j <= i (and
    i - window < j). `q_pos` is (..., Tq), `kv_pos` is (..., L), both absolute token positions."""
    i = q_pos.unsqueeze(-1)  # (..., Tq, 1)
    j = kv_pos.unsqueeze(-2)  # (..., 1, L)
    mask = j <= i  # (..., Tq, L)
    if sliding_window is not None:
        mask &= j > i - sliding_window
    return mask


@dataclass(frozen=True)
class ExtendPlan:
    """Per-forward gather indices and masks of `extend_attention`, shared by every layer."""

    spans: list[tuple[int, int]]  # per request with new tokens: (start in T, number of new tokens)
    slots: list[torch.Tensor]  # per request: (L,) int64 KV slots of its whole sequence
    masks: list[torch.Tensor]  # per request: (Tb, L) bool, query row sees kv column


@dataclass(frozen=True)
class DecodePlan:
    """Per-forward gather indices and mask of `decode_attention`, shared by every layer."""

    slots: torch.Tensor  # (B * L,) int64, row-major over (request, position); padding -> slot 0
    mask: torch.Tensor  # (B, 1, 1, L) bool
    max_len: int  # L


def plan_extend(
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    prefix_lens: torch.Tensor,
    extend_start_loc: torch.Tensor,
    sliding_window: int | None = None,
) -> ExtendPlan:
    """Gather indices and masks per request; with a sliding window, per block of at most
    `window_block(window)` new tokens, each reading only the keys its window reaches, so the
    work is proportional to the window, not to the context."""
    # One host copy of the descriptors instead of a sync per request.
    rows, lens = req_pool_indices.tolist(), seq_lens.tolist()
    prefixes, starts = prefix_lens.tolist(), extend_start_loc.tolist()
    spans, slots, masks = [], [], []
    device = req_to_token.device
    for row, seq_len, prefix_len, start in zip(rows, lens, prefixes, starts):
        step = seq_len - prefix_len if sliding_window is None else window_block(sliding_window)
        for first in range(prefix_len, seq_len, max(step, 1)):  # first new position of the block
            stop = min(first + step, seq_len)
            lo = 0 if sliding_window is None else max(0, first - sliding_window + 1)  # first key any row sees
            kv_pos = torch.arange(lo, stop, device=device)  # (L,)
            spans.append((start + first - prefix_len, stop - first))
            slots.append(req_to_token[row, lo:stop].long())  # (L,) index_select is far faster than fancy indexing
            masks.append(visible_mask(torch.arange(first, stop, device=device), kv_pos, sliding_window))  # (Tb, L)
    return ExtendPlan(spans, slots, masks)


def window_block(sliding_window: int) -> int:
    """New tokens per block of a windowed extend: a block of n reads n + window - 1 keys."""
    return max(sliding_window, 64)


def extend_attention_planned(
    q: torch.Tensor, k_buffer: torch.Tensor, v_buffer: torch.Tensor, plan: ExtendPlan, sm_scale: float
) -> torch.Tensor:
    """`extend_attention` with its gather indices and masks computed once per forward."""
    o = torch.empty_like(q)  # (T, Hq, D)
    for (start, n), slots, mask in zip(plan.spans, plan.slots, plan.masks):
        k = k_buffer.index_select(0, slots).float().transpose(0, 1)  # (H_kv, L, D)
        v = v_buffer.index_select(0, slots).float().transpose(0, 1)  # (H_kv, L, D)
        q_b = q[start:start + n].float().transpose(0, 1)  # (Hq, Tb, D)
        out = F.scaled_dot_product_attention(
            q_b, k, v, attn_mask=mask, scale=sm_scale, enable_gqa=True
        )  # (Hq, Tb, D)
        o[start:start + n] = out.transpose(0, 1).to(q.dtype)  # (Tb, Hq, D)
    return o


def extend_attention(
    q: torch.Tensor,
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    prefix_lens: torch.Tensor,
    extend_start_loc: torch.Tensor,
    max_extend_len: int,
    sm_scale: float,
    sliding_window: int | None = None,
) -> torch.Tensor:
    """Causal attention of the new tokens of B requests over their whole KV (prefix + new).

    q: (T, Hq, D) new tokens, flattened; k_buffer, v_buffer: (num_slots, H_kv, D) already holding
    the new K/V; req_to_token: (max_reqs, max_context_len) int32 slots; req_pool_indices: (B,);
    seq_lens, prefix_lens, extend_start_loc: (B,) in tokens; max_extend_len: unused here (the
    Triton grid needs it); sm_scale: softmax scale; sliding_window: in tokens.
    Returns o: (T, Hq, D) in q's dtype.
    """
    del max_extend_len
    plan = plan_extend(req_to_token, req_pool_indices, seq_lens, prefix_lens, extend_start_loc,
                       sliding_window)
    return extend_attention_planned(q, k_buffer, v_buffer, plan, sm_scale)


def plan_decode(
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    sliding_window: int | None = None,
) -> DecodePlan:
    """With a sliding window each row gathers only its last `window` positions."""
    lens = seq_lens.long()
    first = torch.zeros_like(lens) if sliding_window is None else (lens - sliding_window).clamp(min=0)  # (B,)
    max_len = int((lens - first).max())
    kv_pos = first[:, None] + torch.arange(max_len, device=seq_lens.device)[None, :]  # (B, L)
    in_seq = kv_pos < lens[:, None]  # (B, L)
    # Positions past a request's length hold arbitrary slot ids: point them at slot 0.
    table = req_to_token.index_select(0, req_pool_indices)  # (B, max_context)
    slots = table.gather(1, kv_pos.clamp(max=table.shape[1] - 1)).long()  # (B, L)
    slots = torch.where(in_seq, slots, 0)  # (B, L)
    q_pos = (lens - 1).unsqueeze(-1)  # (B, 1)
    mask = visible_mask(q_pos, kv_pos, sliding_window) & in_seq[:, None, :]  # (B, 1, L)
    return DecodePlan(slots.reshape(-1), mask.unsqueeze(1), max_len)


def decode_attention_planned(
    q: torch.Tensor, k_buffer: torch.Tensor, v_buffer: torch.Tensor, plan: DecodePlan, sm_scale: float
) -> torch.Tensor:
    """`decode_attention` with its gather indices and mask computed once per forward.

    The `group` query heads of one KV head form the rows of one attention problem, so K/V are
    gathered once per KV head and never repeated (GQA without expansion).
    """
    B, Hq, D = q.shape
    H = k_buffer.shape[1]
    k = k_buffer.index_select(0, plan.slots).float().view(B, plan.max_len, H, D).transpose(1, 2)  # (B, H_kv, L, D)
    v = v_buffer.index_select(0, plan.slots).float().view(B, plan.max_len, H, D).transpose(1, 2)  # (B, H_kv, L, D)
    q_grouped = q.float().view(B, H, Hq // H, D)  # (B, H_kv, group, D)
    out = F.scaled_dot_product_attention(q_grouped, k, v, attn_mask=plan.mask, scale=sm_scale)  # (B, H_kv, group, D)
    return out.reshape(B, Hq, D).to(q.dtype)  # (B, Hq, D)


def decode_attention(
    q: torch.Tensor,
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    sm_scale: float,
    sliding_window: int | None = None,
    num_kv_splits: int | None = None,
) -> torch.Tensor:
    """Attention of one query per request (at position seq_lens[b] - 1) over its paged KV.

    q: (B, Hq, D); k_buffer, v_buffer: (num_slots, H_kv, D); req_to_token: (max_reqs,
    max_context_len) int32 slots; req_pool_indices: (B,); seq_lens: (B,) in tokens, >= 1;
    sm_scale: softmax scale; sliding_window: in tokens; num_kv_splits: unused here.
    Returns o: (B, Hq, D) in q's dtype. One padded batched gather and one SDPA call.
    """
    del num_kv_splits
    if q.shape[0] == 0:
        return torch.empty_like(q)
    plan = plan_decode(req_to_token, req_pool_indices, seq_lens, sliding_window)
    return decode_attention_planned(q, k_buffer, v_buffer, plan, sm_scale)


def mla_decode_reference(
    q: torch.Tensor,  # (B, H, R + P) absorbed queries
    latent: torch.Tensor,  # (num_slots, 1, R + P) or (num_slots, R + P)
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    sm_scale: float,
    kv_lora_rank: int,
) -> torch.Tensor:  # (B, H, R + P): values in the first R columns, zeros after
    """Absorbed MLA decode in torch, request by request: the ground truth of `mla_decode_attention`."""
    latent = latent.reshape(latent.shape[0], -1)
    out = torch.zeros_like(q)
    for b, (row, n) in enumerate(zip(req_pool_indices.tolist(), seq_lens.tolist())):
        lat = latent.index_select(0, req_to_token[row, :n].long()).float()  # (n, R + P)
        p = (q[b].float() @ lat.T * sm_scale).softmax(-1)  # (H, n)
        out[b, :, :kv_lora_rank] = (p @ lat[:, :kv_lora_rank]).to(q.dtype)  # (H, R)
    return out


def lora_sgmv_reference(y: torch.Tensor, x: torch.Tensor, a: torch.Tensor, b: torch.Tensor, scaling: torch.Tensor,
                        segments: list[tuple[int, int, int]]) -> torch.Tensor:
    """The torch twin of `lora_sgmv.lora_sgmv`: for each (start, length, slot) with slot >= 0,
    y[start:start + length] += scaling[slot] * (x[...] @ a[slot].T) @ b[slot].T. x (T, K),
    a (S, R, K), b (S, N, R), y (T, N), in place; returns y."""
    for start, length, slot in segments:
        if slot < 0 or length == 0:
            continue
        rows = x[start:start + length]
        y[start:start + length] += (rows @ a[slot].T) @ b[slot].T * scaling[slot]
    return y
