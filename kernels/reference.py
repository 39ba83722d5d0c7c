"""Torch reference implementations of the paged-attention kernels (same signatures).

They are the ground truth for the Triton kernels' tests and, being plain gathers plus SDPA, the
attention of the `torch` backend (the CPU default). They compute in fp32 and return the input
dtype: exact enough to trust, and on CPU faster than bf16 matmuls.
"""

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
    o = torch.empty_like(q)  # (T, Hq, D)
    # One host copy of the descriptors instead of a sync per request.
    rows = req_pool_indices.tolist()
    lens = seq_lens.tolist()
    prefixes = prefix_lens.tolist()
    starts = extend_start_loc.tolist()
    for row, seq_len, prefix_len, start in zip(rows, lens, prefixes, starts):
        extend_len = seq_len - prefix_len
        if extend_len == 0:
            continue
        slots = req_to_token[row, :seq_len].long()  # (L,)
        k = k_buffer[slots].float().transpose(0, 1)  # (H_kv, L, D)
        v = v_buffer[slots].float().transpose(0, 1)  # (H_kv, L, D)
        q_b = q[start:start + extend_len].float().transpose(0, 1)  # (Hq, Tb, D)
        kv_pos = torch.arange(seq_len, device=q.device)  # (L,)
        mask = visible_mask(kv_pos[prefix_len:], kv_pos, sliding_window)  # (Tb, L)
        out = F.scaled_dot_product_attention(
            q_b, k, v, attn_mask=mask, scale=sm_scale, enable_gqa=True
        )  # (Hq, Tb, D)
        o[start:start + extend_len] = out.transpose(0, 1).to(q.dtype)  # (Tb, Hq, D)
    return o


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
    max_len = int(seq_lens.max())
    kv_pos = torch.arange(max_len, device=q.device)  # (L,)
    in_seq = kv_pos[None, :] < seq_lens[:, None]  # (B, L)
    # Positions past a request's length hold arbitrary slot ids: point them at slot 0.
    slots = req_to_token[req_pool_indices, :max_len].long()  # (B, L)
    slots = torch.where(in_seq, slots, 0)  # (B, L)
    k = k_buffer[slots].float().permute(0, 2, 1, 3)  # (B, H_kv, L, D)
    v = v_buffer[slots].float().permute(0, 2, 1, 3)  # (B, H_kv, L, D)
    q_pos = (seq_lens - 1).unsqueeze(-1)  # (B, 1)
    mask = visible_mask(q_pos, kv_pos.expand_as(in_seq), sliding_window) & in_seq[:, None, :]  # (B, 1, L)
    out = F.scaled_dot_product_attention(
        q.float().unsqueeze(2), k, v, attn_mask=mask.unsqueeze(1), scale=sm_scale, enable_gqa=True
    )  # (B, Hq, 1, D)
    return out.squeeze(2).to(q.dtype)  # (B, Hq, D)
