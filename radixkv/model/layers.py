"""Building blocks of Llama-family models: RMSNorm, rotary embedding, SwiGLU MLP, and the
tensor-parallel pieces (a vocabulary-parallel embedding, the row-parallel output + all-reduce).

Every module takes a `TPShard` (which slice of the weights this rank holds; the default is all
of them) and the rank's collectives (`SingleRank` when there is one rank), so one code path
runs both; see `radixkv.parallel.shard` for how the model is split."""

from __future__ import annotations

import math

import torch
from torch import nn

from radixkv.model.config import RopeConfig
from radixkv.model.cpu_runtime import linear_add
from radixkv.parallel.group import SingleRank
from radixkv.parallel.shard import TPShard


class RMSNorm(nn.Module):
    """x / rms(x) * (offset + weight): offset 0 for Llama-family models, 1 for Gemma's
    "(1 + w)" norm, whose stored weights are the difference from one (Gemma also scales in
    fp32 before casting back)."""

    def __init__(self, hidden_size: int, eps: float, offset: float = 0.0):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps, self.offset = eps, offset

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (..., H) -> (..., H)
        dtype = x.dtype
        if self.offset:
            x32 = x.float()
            x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
            return (x32 * (self.offset + self.weight.float())).to(dtype)
        if dtype == torch.float32:  # one fused kernel; the same arithmetic as below
            return nn.functional.rms_norm(x, self.weight.shape, self.weight, self.eps)
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
    elif rope.rope_type == "yarn":
        inv_freq = _yarn_inv_freq(head_dim, rope)
    return inv_freq.float()


def _yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def _yarn_inv_freq(head_dim: int, rope: RopeConfig) -> torch.Tensor:  # (D/2,)
    """YaRN: interpolated low frequencies, extrapolated high ones, a linear ramp between."""
    s = rope.scaling
    factor, old_len = float(s["factor"]), float(s["original_max_position_embeddings"])
    beta_fast, beta_slow = float(s.get("beta_fast") or 32), float(s.get("beta_slow") or 1)

    def correction_dim(rotations: float) -> float:
        return head_dim * math.log(old_len / (rotations * 2 * math.pi)) / (2 * math.log(rope.theta))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if s.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, head_dim - 1)
    if low == high:
        high += 0.001
    pos = rope.theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
    ramp = ((torch.arange(head_dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    extrapolate = 1 - ramp
    return (1.0 / (factor * pos)) * (1 - extrapolate) + (1.0 / pos) * extrapolate


def rope_attention_factor(rope: RopeConfig) -> float:
    """The factor YaRN multiplies cos/sin by (1 for every other type)."""
    if rope.rope_type != "yarn":
        return 1.0
    s = rope.scaling
    if s.get("attention_factor") is not None:
        return float(s["attention_factor"])
    factor, mscale, mscale_all = float(s["factor"]), s.get("mscale"), s.get("mscale_all_dim")
    if mscale and mscale_all:
        return _yarn_mscale(factor, float(mscale)) / _yarn_mscale(factor, float(mscale_all))
    return _yarn_mscale(factor)


def yarn_softmax_scale(rope: RopeConfig) -> float:
    """DeepSeek's extra softmax scale under YaRN: mscale(factor, mscale_all_dim) squared."""
    mscale_all = rope.scaling.get("mscale_all_dim") if rope.rope_type != "default" else None
    if not mscale_all:
        return 1.0
    return _yarn_mscale(float(rope.scaling["factor"]), float(mscale_all)) ** 2


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
        factor = rope_attention_factor(self.rope)
        self.cos = freqs.cos() * factor  # (P, D/2)
        self.sin = freqs.sin() * factor  # (P, D/2)

    def cos_sin(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Rotate-half tables for `positions` (T,), shaped to broadcast over heads.

        Returns `cos2 = [cos, cos]` and `sin2 = [-sin, sin]`, (T, 1, D) each, so a rotation is
        `x * cos2 + swap_halves(x) * sin2`: three kernels per tensor, built once per forward.
        """
        cos, sin = self.cos[positions], self.sin[positions]  # (T, D/2) each
        return torch.cat((cos, cos), -1)[:, None, :], torch.cat((-sin, sin), -1)[:, None, :]


def rotate(x: torch.Tensor, cos2: torch.Tensor, sin2: torch.Tensor) -> torch.Tensor:
    """Rotate x (T, H, D) by the angles of its positions (tables from `RotaryEmbedding.cos_sin`).

    The two halves of the head dimension form the rotated pairs:
    out = [x1 * cos - x2 * sin, x2 * cos + x1 * sin].
    """
    x32 = x.float()
    x1, x2 = x32.chunk(2, dim=-1)  # (T, H, D/2) each
    out = torch.addcmul(x32 * cos2, torch.cat((x2, x1), dim=-1), sin2)  # (T, H, D)
    return out.to(x.dtype)


def row_parallel_add(linear: nn.Module, x: torch.Tensor, residual: torch.Tensor, comm) -> torch.Tensor:
    """`residual + linear(x)` where each rank holds a slice of `linear`'s input columns and of
    `x` (T, in/N): the partial products are summed by one all-reduce, and rank 0 alone adds the
    residual (fused into its GEMM when packed), so the sum holds it once."""
    if comm.rank == 0:
        return comm.all_reduce(linear_add(linear, x, residual))  # (T, out)
    return comm.all_reduce(linear(x))  # (T, out)


def activation(name: str):
    """The gate activation of a gated MLP: SiLU (SwiGLU) or tanh-approximated GELU (GeGLU)."""
    if name == "gelu_pytorch_tanh":
        return lambda x: nn.functional.gelu(x, approximate="tanh")
    return nn.functional.silu


class SwiGLU(nn.Module):
    """down(act(gate(x)) * up(x)), with gate and up fused into one matmul; act is SiLU unless
    `hidden_act` says GELU-tanh (Gemma).

    Tensor-parallel: this rank's `I/N` columns of gate and up, the same rows of down."""

    def __init__(self, hidden_size: int, intermediate_size: int, shard: TPShard = TPShard(),
                 comm=SingleRank(), hidden_act: str = "silu"):
        super().__init__()
        local = shard.local(intermediate_size)
        self.comm = comm
        self.act = activation(hidden_act)
        self.gate_up_proj = nn.Linear(hidden_size, 2 * local, bias=False)
        self.down_proj = nn.Linear(local, hidden_size, bias=False)

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None) -> torch.Tensor:  # (T, H) -> (T, H)
        """`residual + down(act(gate(x)) * up(x))` (no residual when it is None)."""
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)  # (T, I/N) each
        if residual is None:
            return self.comm.all_reduce(self.down_proj(self.act(gate) * up))
        return row_parallel_add(self.down_proj, self.act(gate) * up, residual, self.comm)


class VocabParallelEmbedding(nn.Module):
    """Token embedding whose rows are split over the ranks (`TPShard.vocab_rows`).

    A rank looks up the tokens in its rows and contributes zeros for the rest; one all-reduce
    assembles every token's embedding. `weight` is (Vp, H), its rows past the vocabulary zero."""

    def __init__(self, vocab_size: int, hidden_size: int, shard: TPShard = TPShard(), comm=SingleRank()):
        super().__init__()
        self.first, self.stop, padded = shard.vocab_rows(vocab_size)
        self.comm = comm
        self.weight = nn.Parameter(torch.empty(padded, hidden_size))  # (Vp, H)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:  # (T,) -> (T, H)
        if self.comm.size == 1:
            return nn.functional.embedding(ids, self.weight)
        mine = (ids >= self.first) & (ids < self.stop)  # (T,)
        local = torch.where(mine, ids - self.first, 0)  # (T,)
        x = nn.functional.embedding(local, self.weight) * mine[:, None].to(self.weight.dtype)  # (T, H)
        return self.comm.all_reduce(x)
