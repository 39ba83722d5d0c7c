"""Multi-head latent attention (DeepSeek V2/V3) over a latent KV pool.

A token's keys and values are never stored per head. `kv_a_proj_with_mqa` compresses the hidden
state into a latent `c` (`kv_lora_rank` values, RMS-normalised) and one RoPE key `k_pe`
(`qk_rope_head_dim`) shared by every head; the pool keeps `[c, k_pe]` (one "KV head" of
`latent_dim` values, `KVLayout.latent`). Head h's key and value are up-projections of the latent
through `kv_b_proj`: `k_h = [W_UK_h c, k_pe]`, `v_h = W_UV_h c`.

Attention runs in the **absorbed** form: since `q_nope_h . (W_UK_h c) = (W_UK_h^T q_nope_h) . c`,
the K up-projection is folded into the query, so every head attends to the latents themselves
(multi-query attention with one KV head of `latent_dim` values):

    q_h' = [W_UK_h^T q_nope_h, q_pe_h]             (H, kv_lora_rank + rope)
    o_h' = softmax(q_h' . [c, k_pe] * scale) [c, k_pe]
    o_h  = W_UV_h o_h'[:kv_lora_rank]              (the RoPE columns of o_h' are dropped)

Every attention backend runs it unchanged (V is the latent itself; its RoPE columns cost 1/9 of
the value work and are dropped), decode reads only latents, and the radix cache, host tier and
KV formats see one tensor per layer. `up_projected_attention` is the textbook form (per-head K
and V expanded from the latents), the reference the absorbed form is tested against.

RoPE: DeepSeek rotates interleaved pairs `(x0, x1), (x2, x3), ...`. The loader permutes the RoPE
rows of `q_proj`/`q_b_proj` and `kv_a_proj_with_mqa` into halves (`deinterleave_rope_rows`), so
the usual rotate-half code applies; q and k get the same permutation, so every score is unchanged.
"""

from __future__ import annotations

import torch
from torch import nn

from radixkv.attention.backend import AttentionBackend
from radixkv.attention.forward_batch import ForwardBatch
from radixkv.model.config import ModelConfig
from radixkv.model.layers import RMSNorm, rotate, yarn_softmax_scale


class MLAAttention(nn.Module):
    """One layer's latent attention, absorbed form; parameter names follow Hugging Face."""

    def __init__(self, config: ModelConfig, layer: int):
        super().__init__()
        m = config.mla
        assert m is not None, "MLAAttention needs config.mla"
        self.layer, self.m = layer, m
        self.num_heads = config.num_heads
        h = config.hidden_size
        q_out = self.num_heads * m.qk_head_dim
        if m.q_lora_rank is None:
            self.q_proj = nn.Linear(h, q_out, bias=False)
        else:
            self.q_a_proj = nn.Linear(h, m.q_lora_rank, bias=config.attention_bias)
            self.q_a_layernorm = RMSNorm(m.q_lora_rank, 1e-6)
            self.q_b_proj = nn.Linear(m.q_lora_rank, q_out, bias=False)
        self.kv_a_proj_with_mqa = nn.Linear(h, m.latent_dim, bias=config.attention_bias)
        self.kv_a_layernorm = RMSNorm(m.kv_lora_rank, 1e-6)
        self.kv_b_proj = nn.Linear(m.kv_lora_rank, self.num_heads * (m.qk_nope_head_dim + m.v_head_dim), bias=False)
        self.o_proj = nn.Linear(self.num_heads * m.v_head_dim, h, bias=config.attention_bias)
        self.sm_scale = m.qk_head_dim**-0.5 * yarn_softmax_scale(config.rope)
        # derived from kv_b_proj once the weights are in (`finish_load`)
        self.register_buffer("w_uk", torch.empty(0), persistent=False)  # (H, nope, rank)
        self.register_buffer("w_uv", torch.empty(0), persistent=False)  # (H, rank, v)

    def finish_load(self) -> None:
        """Split `kv_b_proj` into the absorbed query's W_UK and the output's W_UV."""
        m = self.m
        w = self.kv_b_proj.weight.detach().view(self.num_heads, m.qk_nope_head_dim + m.v_head_dim, m.kv_lora_rank)
        self.w_uk = w[:, : m.qk_nope_head_dim].contiguous()  # (H, nope, rank)
        self.w_uv = w[:, m.qk_nope_head_dim :].transpose(1, 2).contiguous()  # (H, rank, v)

    def project(
        self, x: torch.Tensor, cos_sin: tuple[torch.Tensor, torch.Tensor]
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Queries and latents of x (T, hidden): q_nope (T, H, nope), q_pe (T, H, rope) rotated,
        latent (T, 1, rank + rope) with its RoPE part rotated."""
        m, T = self.m, x.shape[0]
        if m.q_lora_rank is None:
            q = self.q_proj(x)
        else:
            q = self.q_b_proj(self.q_a_layernorm(self.q_a_proj(x)))
        q = q.view(T, self.num_heads, m.qk_head_dim)  # (T, H, nope + rope)
        q_nope, q_pe = q.split([m.qk_nope_head_dim, m.qk_rope_head_dim], dim=-1)
        ckv = self.kv_a_proj_with_mqa(x)  # (T, rank + rope)
        c, k_pe = ckv.split([m.kv_lora_rank, m.qk_rope_head_dim], dim=-1)
        # q's RoPE heads and the one shared RoPE key rotate as one tensor of H + 1 heads
        pe = rotate(torch.cat((q_pe, k_pe[:, None, :]), dim=1), *cos_sin)  # (T, H + 1, rope)
        latent = torch.cat((self.kv_a_layernorm(c), pe[:, -1]), dim=-1)[:, None, :]  # (T, 1, rank + rope)
        return q_nope, pe[:, :-1], latent

    def forward(
        self,
        x: torch.Tensor,  # (T, hidden)
        cos_sin: tuple[torch.Tensor, torch.Tensor],  # (T, 1, rope) each
        backend: AttentionBackend,
        fb: ForwardBatch,
        residual: torch.Tensor | None,  # (T, hidden)
    ) -> torch.Tensor:  # (T, hidden)
        m = self.m
        q_nope, q_pe, latent = self.project(x, cos_sin)
        # batched over heads (bmm, not einsum: the compiled graph's token count is unbacked)
        q_lat = torch.bmm(q_nope.transpose(0, 1), self.w_uk).transpose(0, 1)  # (T, H, rank): W_UK folded into q
        q = torch.cat((q_lat, q_pe), dim=-1)  # (T, H, rank + rope)
        o = backend.forward(q, latent, latent, self.layer, self.sm_scale, None, fb)  # (T, H, rank + rope)
        o = torch.bmm(o[..., : m.kv_lora_rank].transpose(0, 1), self.w_uv).transpose(0, 1)  # (T, H, v)
        out = self.o_proj(o.reshape(o.shape[0], self.num_heads * m.v_head_dim))  # (T, hidden); no -1: T is unbacked when compiled
        return out if residual is None else residual + out


def up_projected_attention(
    attn: MLAAttention,
    q_nope: torch.Tensor,  # (n, H, nope) the new tokens' queries
    q_pe: torch.Tensor,  # (n, H, rope)
    latents: torch.Tensor,  # (L, rank + rope) every visible token's latent, in position order
    causal_offset: int,  # position of the first query: query i sees latents [0, causal_offset + i]
) -> torch.Tensor:  # (n, H, v)
    """MLA as written in the paper: expand each latent into per-head K and V, then attend.
    The reference for the absorbed form (`MLAAttention.forward`)."""
    m, H = attn.m, attn.num_heads
    c, k_pe = latents.split([m.kv_lora_rank, m.qk_rope_head_dim], dim=-1)
    kv = attn.kv_b_proj(c).view(-1, H, m.qk_nope_head_dim + m.v_head_dim)  # (L, H, nope + v)
    k_nope, v = kv.split([m.qk_nope_head_dim, m.v_head_dim], dim=-1)
    k = torch.cat((k_nope, k_pe[:, None, :].expand(-1, H, -1)), dim=-1)  # (L, H, nope + rope)
    q = torch.cat((q_nope, q_pe), dim=-1)  # (n, H, nope + rope)
    scores = torch.einsum("nhd,lhd->hnl", q.float(), k.float()) * attn.sm_scale  # (H, n, L)
    visible = torch.arange(latents.shape[0])[None, :] <= causal_offset + torch.arange(q.shape[0])[:, None]
    scores = scores.masked_fill(~visible[None], float("-inf"))
    return torch.einsum("hnl,lhv->nhv", scores.softmax(-1), v.float())  # (n, H, v)


def deinterleave_rope_rows(weight: torch.Tensor, head_dim: int, rope_dim: int) -> torch.Tensor:
    """Rows of a projection whose output is heads of `head_dim`, each ending in `rope_dim`
    interleaved RoPE values, with those values reordered into halves (evens, then odds)."""
    rows = weight.shape[0]
    assert rows % head_dim == 0, (rows, head_dim)
    index = torch.arange(rows).view(-1, head_dim)  # (heads, head_dim)
    rope = index[:, head_dim - rope_dim:]
    index = torch.cat((index[:, : head_dim - rope_dim], rope[:, 0::2], rope[:, 1::2]), dim=1)
    return weight.index_select(0, index.reshape(-1))
