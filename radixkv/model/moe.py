"""Mixture-of-experts MLP: a router picks `top_k` experts per token; each active expert runs once.

Dispatch is sorted, not dense: the (token, expert) assignments of a forward are sorted by expert,
the tokens gathered in that order, and each expert that received any runs one gated MLP on its
contiguous block; the outputs, weighted by the router, are summed back onto their tokens. Work is
`top_k / num_experts` of running every expert on every token. Shared experts (DeepSeek) are one
dense MLP every token passes through.

Routing follows `MoEConfig` (softmax or sigmoid scores; greedy, group-limited or V3's
`noaux_tc` choice; optional renormalisation; the routed scaling factor). `naive_moe` computes
the same thing token by token, the reference the sorted dispatch is tested against.

Each block counts the tokens it routed to each expert in the last forward
(`last_tokens_per_expert`) and since load (`tokens_per_expert`).
"""

from __future__ import annotations

import torch
from torch import nn

from radixkv.model.config import MoEConfig
from radixkv.model.layers import SwiGLU, activation


def route(
    logits: torch.Tensor,  # (T, E) router logits, fp32
    cfg: MoEConfig,
    bias: torch.Tensor | None = None,  # (E,) V3's score correction (for choosing only)
) -> tuple[torch.Tensor, torch.Tensor]:  # (T, k) fp32 weights, (T, k) int64 expert ids
    """Each token's experts and their weights."""
    scores = logits.softmax(-1) if cfg.scoring == "softmax" else logits.sigmoid()  # (T, E)
    choice = scores if bias is None else scores + bias
    if cfg.method != "greedy" and cfg.n_group > 1:
        T, E = scores.shape
        grouped = choice.view(T, cfg.n_group, E // cfg.n_group)  # (T, G, E/G)
        if cfg.method == "noaux_tc":
            group_score = grouped.topk(min(2, grouped.shape[-1]), dim=-1).values.sum(-1)  # (T, G)
        else:
            group_score = grouped.max(-1).values  # (T, G)
        keep = torch.zeros_like(group_score, dtype=torch.bool)
        keep.scatter_(1, group_score.topk(cfg.topk_group, dim=-1).indices, True)  # (T, G)
        keep = keep[:, :, None].expand_as(grouped).reshape(T, E)  # (T, E)
        # V2 zeroes the other groups' scores, V3 makes them unchoosable
        choice = choice.masked_fill(~keep, float("-inf") if cfg.method == "noaux_tc" else 0.0)
    ids = choice.topk(cfg.top_k, dim=-1).indices  # (T, k)
    weights = scores.gather(1, ids)  # (T, k)
    if cfg.norm_topk_prob:
        weights = weights / (weights.sum(-1, keepdim=True) + (1e-20 if cfg.scoring == "sigmoid" else 0.0))
    return weights * cfg.routed_scaling_factor, ids


class Router(nn.Module):
    """The router's weights (E, H) and, for V3's `noaux_tc`, the score correction bias (E,)."""

    def __init__(self, hidden_size: int, cfg: MoEConfig):
        super().__init__()
        self.cfg = cfg
        self.weight = nn.Parameter(torch.empty(cfg.num_experts, hidden_size))  # (E, H)
        self.e_score_correction_bias = (nn.Parameter(torch.zeros(cfg.num_experts), requires_grad=False)
                                        if cfg.method == "noaux_tc" else None)  # (E,)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:  # (T, H) -> (T, k) x2
        bias = None if self.e_score_correction_bias is None else self.e_score_correction_bias.float()
        return route(nn.functional.linear(x.float(), self.weight.float()), self.cfg, bias)


class MoEBlock(nn.Module):
    """Router + routed experts (+ shared experts) of one layer.

    Experts are stacked: `w_gate_up` (E, 2I, H) and `w_down` (E, H, I); the loader fills them
    from the checkpoint's per-expert tensors."""

    def __init__(self, hidden_size: int, cfg: MoEConfig, hidden_act: str = "silu"):
        super().__init__()
        self.cfg = cfg
        E, I = cfg.num_experts, cfg.intermediate_size
        self.act = activation(hidden_act)
        self.gate = Router(hidden_size, cfg)
        self.w_gate_up = nn.Parameter(torch.empty(E, 2 * I, hidden_size))  # (E, 2I, H)
        self.w_down = nn.Parameter(torch.empty(E, hidden_size, I))  # (E, H, I)
        self.shared_experts = (SwiGLU(hidden_size, I * cfg.num_shared_experts, hidden_act=hidden_act)
                               if cfg.num_shared_experts else None)
        self.register_buffer("tokens_per_expert", torch.zeros(E, dtype=torch.int64), persistent=False)
        self.register_buffer("last_tokens_per_expert", torch.zeros(E, dtype=torch.int64), persistent=False)

    def finish_load(self) -> None:
        """Start the counters at zero (a model built on `meta` gets uninitialised buffers)."""
        self.tokens_per_expert.zero_()
        self.last_tokens_per_expert.zero_()

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None) -> torch.Tensor:  # (T, H) -> (T, H)
        """`residual + shared(x) + sum over the chosen experts e of w_e * expert_e(x)`."""
        weights, ids = self.gate(x)  # (T, k) each
        k = ids.shape[1]
        flat = ids.reshape(-1)  # (T*k,) expert of each assignment
        order = flat.argsort(stable=True)  # assignments grouped by expert
        counts = torch.bincount(flat, minlength=self.cfg.num_experts)  # (E,)
        self.last_tokens_per_expert.copy_(counts)
        self.tokens_per_expert.add_(counts)
        token = order // k  # (T*k,) token of each sorted assignment
        xs = x.index_select(0, token)  # (T*k, H) tokens in expert order
        ys = torch.empty_like(xs)
        start = 0
        for e, n in enumerate(counts.tolist()):  # only the experts that received tokens run
            if n:
                block = xs[start:start + n]  # (n, H)
                gate, up = nn.functional.linear(block, self.w_gate_up[e]).chunk(2, dim=-1)  # (n, I) each
                ys[start:start + n] = nn.functional.linear(self.act(gate) * up, self.w_down[e])
                start += n
        ys = ys * weights.reshape(-1).index_select(0, order)[:, None].to(ys.dtype)  # (T*k, H)
        out = torch.zeros_like(x) if residual is None else residual.clone()
        out.index_add_(0, token, ys)  # (T, H)
        if self.shared_experts is not None:
            out = self.shared_experts(x, residual=out)
        return out


def naive_moe(block: MoEBlock, x: torch.Tensor) -> torch.Tensor:  # (T, H) -> (T, H)
    """The MoE output computed token by token, every chosen expert in turn (the reference)."""
    weights, ids = block.gate(x)
    out = torch.zeros_like(x)
    for t in range(x.shape[0]):
        for w, e in zip(weights[t].tolist(), ids[t].tolist()):
            gate, up = (block.w_gate_up[e] @ x[t]).chunk(2)
            out[t] += w * (block.w_down[e] @ (block.act(gate) * up))
    if block.shared_experts is not None:
        out = block.shared_experts(x, residual=out)
    return out
