"""KV-cache storage formats: what a token's K (or V) becomes in the pool, and back.

Formats (`kv_cache_dtype`):
- `auto`: the model's dtype; `float32`, `fp16`, `bf16`: a plain cast.
- `fp8_e4m3`, `fp8_e5m2`: a saturating cast to 8-bit floats (unit scale, as vLLM and SGLang
  use without calibration), stored as bytes (`uint8`) and bit-cast back.
- `int8`: symmetric, one float32 scale per token and KV head: `x ~ code * scale`,
  `scale = max|x| / 127` over the head's `head_dim` values.
- `int4`: asymmetric, group-wise along `head_dim` (groups of `INT4_GROUP`, or the whole head when
  `head_dim` is not a multiple of it), two values per byte (even index in the low nibble), and
  per group a float16 pair (scale, minimum): `x ~ nibble * scale + minimum`,
  `scale = (max - min) / 15`. Asymmetric groups of 16 keep SmolLM2's perplexity within about
  1 % of full precision; symmetric groups of 32 (same bytes) cost 14 % -- keys are skewed
  (see `benchmarks/kv_quant.py`).

Quantise on store, dequantise where attention reads. Every function keeps the leading
dimensions and works on `(..., head_dim)` tensors.
"""

from __future__ import annotations

import torch

from radixkv import kv_bytes
from radixkv.errors import ConfigError
from radixkv.kv_bytes import INT4_GROUP, KV_CACHE_DTYPES, bytes_per_head  # noqa: F401  (INT4_GROUP: the format's)
SCALE_DTYPE = torch.float32  # int8: one per token and KV head
INT4_SCALE_DTYPE = torch.float16  # int4: a (scale, minimum) pair per group
_MIN_SCALE = 1e-8  # an all-zero head quantises to zeros, not NaN
_MIN_INT4_SCALE = 2.0 ** -24  # the smallest positive float16

FLOAT_FORMATS = {"float32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
FP8_FORMATS = {"fp8_e4m3": torch.float8_e4m3fn, "fp8_e5m2": torch.float8_e5m2}


def check_kv_cache_dtype(name: str) -> str:
    if name not in KV_CACHE_DTYPES:
        raise ConfigError(f"kv_cache_dtype={name!r}: must be one of {list(KV_CACHE_DTYPES)}")
    return name


def int4_group(head_dim: int) -> int:
    """Values sharing one int4 scale."""
    if head_dim % 2:
        raise ConfigError(f"int4 KV needs an even head_dim (two values per byte), got {head_dim}")
    return kv_bytes.int4_group(head_dim)


def bytes_per_head_token(kv_cache_dtype: str, head_dim: int, model_dtype: torch.dtype) -> int:
    """Bytes one token's K (or V) of one KV head takes in the pool, scales included."""
    if kv_cache_dtype == "auto":
        return head_dim * torch.empty((), dtype=model_dtype).element_size()
    if kv_cache_dtype == "int4":
        int4_group(head_dim)  # refuses an odd head_dim, naming the reason
    if kv_cache_dtype in KV_CACHE_DTYPES:
        return bytes_per_head(kv_cache_dtype, head_dim)  # one arithmetic, shared with `radixkv kv-size`
    raise ConfigError(f"kv_cache_dtype={kv_cache_dtype!r}: must be one of {list(KV_CACHE_DTYPES)}")


# -- int8 ----------------------------------------------------------------------------------------
def quantize_int8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x: (..., D) -> codes (..., D) int8, scale (...) float32."""
    xf = x.float()
    scale = (xf.abs().amax(-1) / 127.0).clamp_min(_MIN_SCALE)  # (...)
    codes = torch.round(xf / scale.unsqueeze(-1)).clamp_(-127, 127).to(torch.int8)  # (..., D)
    return codes, scale


def dequantize_int8(codes: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """codes (..., D) int8, scale (...) -> (..., D) in `dtype`."""
    return (codes.float() * scale.unsqueeze(-1)).to(dtype)


# -- int4 ----------------------------------------------------------------------------------------
def quantize_int4(x: torch.Tensor, group: int) -> tuple[torch.Tensor, torch.Tensor]:
    """x: (..., D) -> packed (..., D // 2) uint8, scale (..., D // group, 2) float16 pairs
    (scale, minimum)."""
    *lead, d = x.shape
    xg = x.float().reshape(*lead, d // group, group)  # (..., G, group)
    lo = xg.amin(-1).to(INT4_SCALE_DTYPE)  # (..., G) rounded first: quantise against what is stored
    scale = ((xg.amax(-1) - lo.float()) / 15.0).clamp_min(_MIN_INT4_SCALE).to(INT4_SCALE_DTYPE)  # (..., G)
    q = torch.round((xg - lo.float().unsqueeze(-1)) / scale.float().unsqueeze(-1)).clamp_(0, 15).to(torch.int16)
    q = q.reshape(*lead, d // 2, 2)  # (..., D/2, 2): even index low nibble, odd high
    packed = (q[..., 0] | (q[..., 1] << 4)).to(torch.uint8)  # (..., D/2)
    return packed, torch.stack((scale, lo), -1)  # (..., G, 2)


def dequantize_int4(packed: torch.Tensor, scale: torch.Tensor, group: int, dtype: torch.dtype) -> torch.Tensor:
    """packed (..., D // 2) uint8, scale (..., D // group, 2) -> (..., D) in `dtype`."""
    *lead, half = packed.shape
    p = packed.to(torch.int16)
    q = torch.stack((p & 0xF, p >> 4), -1).reshape(*lead, half * 2).float()  # (..., D) codes 0..15
    s = scale.float()  # (..., G, 2)
    x = q.view(*lead, -1, group) * s[..., 0:1] + s[..., 1:2]  # (..., G, group)
    return x.reshape(*lead, half * 2).to(dtype)


# -- fp8 -----------------------------------------------------------------------------------------
def quantize_fp8(x: torch.Tensor, fp8: torch.dtype) -> torch.Tensor:
    """x (..., D) -> bytes (..., D) uint8 holding saturated fp8 values."""
    limit = torch.finfo(fp8).max
    return x.float().clamp(-limit, limit).to(fp8).view(torch.uint8)


def dequantize_fp8(codes: torch.Tensor, fp8: torch.dtype, dtype: torch.dtype) -> torch.Tensor:
    return codes.view(fp8).to(dtype)


def round_trip(x: torch.Tensor, kv_cache_dtype: str) -> torch.Tensor:
    """What reading `x` back from a pool of this format gives (for tests and quality reports)."""
    d = x.shape[-1]
    if kv_cache_dtype == "auto":
        return x.clone()
    if kv_cache_dtype in FLOAT_FORMATS:
        return x.to(FLOAT_FORMATS[kv_cache_dtype]).to(x.dtype)
    if kv_cache_dtype in FP8_FORMATS:
        fp8 = FP8_FORMATS[kv_cache_dtype]
        return dequantize_fp8(quantize_fp8(x, fp8), fp8, x.dtype)
    if kv_cache_dtype == "int8":
        return dequantize_int8(*quantize_int8(x), x.dtype)
    if kv_cache_dtype == "int4":
        g = int4_group(d)
        packed, scale = quantize_int4(x, g)
        return dequantize_int4(packed, scale, g, x.dtype)
    raise ConfigError(f"kv_cache_dtype={kv_cache_dtype!r}: must be one of {list(KV_CACHE_DTYPES)}")
