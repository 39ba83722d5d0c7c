"""Building blocks of Llama-family models: RMSNorm, rotary embedding, SwiGLU MLP."""

from __future__ import annotations

import math

import torch
from torch import nn

from radixkv.model.config import RopeConfig


class RMSNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (T, H) -> (T, H)
        dtype = x.dtype
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(dtype)


def rope_inv_freq(head_dim: int, rope: RopeConfig) -> torch.Tensor:  # (D/2,)
    """Inverse frequencies of the rotary embedding, with linear or llama3 scaling applied."""
    inv_freq = 1.0 / (rope.theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))
    s = rope.scaling
    if rope.rope_type == "linear":
        inv_freq = inv_freq / float(s["factor"])
    elif rope.rope_type == "llama3":
        factor = float(s["factor"])
        low, high = float(s["low_freq_factor"]), float(s["high_freq_factor"])
        old_len = float(s["original_max_position_embeddings"])
        wavelen = 2 * math.pi / inv_freq
        scaled = torch.where(wavelen > old_len / low, inv_freq / factor, inv_freq)
        smooth = (old_len / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = (wavelen >= old_len / high) & (wavelen <= old_len / low)
        inv_freq = torch.where(medium, smoothed, scaled)
    return inv_freq.float()


class RotaryEmbedding(nn.Module):
    """Rotate-half RoPE (the Hugging Face layout) with a cos/sin table up to `max_positions`."""

    def __init__(self, head_dim: int, max_positions: int, rope: RopeConfig):
        super().__init__()
        self.head_dim, self.max_positions, self.rope = head_dim, max_positions, rope
        self.register_buffer("cos", torch.empty(0), persistent=False)
        self.register_buffer("sin", torch.empty(0), persistent=False)
        self.build_tables()

    def build_tables(self, device: torch.device | str | None = None) -> None:
        """(Re)compute the fp32 cos/sin tables, e.g. after the module was built on `meta`."""
        device = device if device is not None else self.cos.device
        if torch.device(device).type == "meta":
            return
        inv_freq = rope_inv_freq(self.head_dim, self.rope).to(device)  # (D/2,)
        t = torch.arange(self.max_positions, dtype=torch.float32, device=device)
        freqs = torch.outer(t, inv_freq)  # (P, D/2)
        self.cos = freqs.cos()  # (P, D/2)
        self.sin = freqs.sin()  # (P, D/2)

    def cos_sin(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Tables for `positions` (T,), shaped to broadcast over heads: (T, 1, D/2) each."""
        return self.cos[positions][:, None, :], self.sin[positions][:, None, :]


def apply_rotary(
    q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate q (T, Hq, D) and k (T, Hkv, D) by the angles of their positions."""
    return _rotate(q, cos, sin), _rotate(k, cos, sin)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    # x: (T, H, D); the two halves of the head dimension form the rotated pairs
    x1, x2 = x.float().chunk(2, dim=-1)  # (T, H, D/2) each
    out = torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)  # (T, H, D)
    return out.to(x.dtype)


class SwiGLU(nn.Module):
    """down(silu(gate(x)) * up(x)), with gate and up fused into one matmul."""

    def __init__(self, hidden_size: int, intermediate_size: int):
        super().__init__()
        self.gate_up_proj = nn.Linear(hidden_size, 2 * intermediate_size, bias=False)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (T, H) -> (T, H)
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)  # (T, I) each
        return self.down_proj(nn.functional.silu(gate) * up)
