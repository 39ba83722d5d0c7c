"""KV byte arithmetic: what one token's K/V costs in each KV format, and sizes in bytes.

The runtime's pools (`radixkv.mem`), its configuration and the `radixkv kv-size` calculator
share this one arithmetic; it imports nothing of radixkv but its errors.

Per token and KV head of each stored tensor (K, V, or an MLA latent), `head_dim` elements:
- float32 / fp16 / bf16 / fp8: the element size times `head_dim`;
- int8: `head_dim` bytes + one float32 scale;
- int4: half a byte per element + a float16 (scale, minimum) pair per group of `INT4_GROUP`
  elements along `head_dim` (one group of `head_dim` if it does not divide).
"""

from __future__ import annotations

import re

from radixkv.errors import ConfigError

INT4_GROUP = 16
"""Elements along head_dim sharing one (scale, minimum) pair in the int4 layout."""

_SCALE_BYTES = 4  # int8: one float32 scale
_PAIR_BYTES = 4  # int4: two float16 values
_ELEMENT_BYTES = {"float32": 4, "fp16": 2, "bf16": 2, "fp8_e4m3": 1, "fp8_e5m2": 1}
KV_DTYPES = ("float32", "fp16", "bf16", "fp8_e4m3", "fp8_e5m2", "int8", "int4")
"""Every KV dtype the calculator knows, in the order `all` lists them ('auto' resolves to one)."""

_DTYPE_ALIASES = {"fp32": "float32", "float": "float32", "float16": "fp16", "half": "fp16",
                  "bfloat16": "bf16", "float8_e4m3fn": "fp8_e4m3", "float8_e4m3": "fp8_e4m3",
                  "fp8": "fp8_e4m3", "float8_e5m2": "fp8_e5m2"}
FLOAT_KV_DTYPES = tuple(_ELEMENT_BYTES)
"""KV dtypes stored without scales (a config's own dtype is one of these)."""
KV_CACHE_DTYPES = ("auto", *KV_DTYPES)
"""What `kv_cache_dtype` accepts: `auto` (the model's dtype) or a KV dtype."""


def int4_group(head_dim: int) -> int:
    """Values of `head_dim` sharing one int4 (scale, minimum) pair."""
    return INT4_GROUP if head_dim % INT4_GROUP == 0 else head_dim


def bytes_per_head(kv_dtype: str, head_dim: int) -> int:
    """Bytes of one (token, KV head) of K or V stored as `kv_dtype` (not 'auto'), scales
    included: the layouts of the runtime's pools (`radixkv.mem.kv_pool`)."""
    if kv_dtype == "int8":
        return head_dim + _SCALE_BYTES
    if kv_dtype == "int4":
        if head_dim % 2:
            raise ConfigError(f"int4 KV needs an even head_dim, got {head_dim}")
        return head_dim // 2 + _PAIR_BYTES * (head_dim // int4_group(head_dim))
    return head_dim * _ELEMENT_BYTES[kv_dtype]


def canonical_kv_dtype(name: str) -> str:
    """The canonical name of a KV dtype ('auto' stays 'auto'); raises ConfigError if unknown."""
    key = name.strip().lower()
    key = _DTYPE_ALIASES.get(key, key)
    if key != "auto" and key not in KV_DTYPES:
        raise ConfigError(f"unknown KV dtype {name!r}: expected auto or one of {', '.join(KV_DTYPES)}")
    return key


_SIZE_UNITS = {"": 1, "b": 1, "k": 1000, "kb": 1000, "m": 1000**2, "mb": 1000**2, "g": 1000**3,
               "gb": 1000**3, "t": 1000**4, "tb": 1000**4, "kib": 1024, "mib": 1024**2,
               "gib": 1024**3, "tib": 1024**4}


def element_dtype(name: str) -> str | None:
    """The canonical name of a floating dtype as configs spell it ('bfloat16' -> 'bf16'), or
    None when it is not one a KV pool can store unscaled."""
    key = _DTYPE_ALIASES.get(str(name).lower(), str(name).lower())
    return key if key in _ELEMENT_BYTES else None


def parse_size(text: str) -> int:
    """Bytes in a size such as '24GiB', '80GB', '512MiB', '1.5 GiB' or '1000000'.

    KB/MB/GB/TB are powers of 1000, KiB/MiB/GiB/TiB powers of 1024 (case-insensitive).
    """
    match = re.fullmatch(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*([A-Za-z]*)\s*", text)
    unit = match and match.group(2).lower()
    if not match or unit not in _SIZE_UNITS:
        raise ConfigError(f"invalid size {text!r}: expected a number of bytes, optionally with a "
                          f"unit (B, KB, MB, GB, TB, KiB, MiB, GiB, TiB), e.g. 24GiB or 80GB")
    return int(float(match.group(1)) * _SIZE_UNITS[unit])


def format_bytes(num_bytes: int) -> str:
    """`num_bytes` in the largest binary unit keeping it >= 1: '512 B', '128 KiB', '68.62 KiB'."""
    value, unit = float(num_bytes), "B"
    for next_unit in ("KiB", "MiB", "GiB", "TiB"):
        if value < 1024:
            break
        value, unit = value / 1024, next_unit
    text = f"{value:.2f}".rstrip("0").rstrip(".")
    return f"{text} {unit}"


def parse_host_size(text: str | int, field: str = "host_kv_size") -> tuple[str, int]:
    """`--host-kv-size`: a plain number is tokens ("200000"), a number with a unit is bytes
    ("2GiB", "512MB"; units as in `radixkv kv-size`). Returns ("tokens" | "bytes", amount)."""
    s = str(text).strip()
    bad = ConfigError(f"{field}={text!r}: give tokens (e.g. 200000) or bytes with a unit "
                      f"(e.g. 2GiB, 512MB)")
    if not any(c.isalpha() for c in s):
        if not s.isdigit() or int(s) <= 0:
            raise bad
        return "tokens", int(s)
    try:
        amount = parse_size(s)
    except ConfigError:
        raise bad from None
    if amount <= 0:
        raise bad
    return "bytes", amount


def host_tier_pages(size: str | int, page_size: int, bytes_per_page: int, field: str = "host_kv_size") -> int:
    """Host pages that `size` (see `parse_host_size`) holds."""
    kind, amount = parse_host_size(size, field)
    pages = amount // page_size if kind == "tokens" else amount // bytes_per_page - 1
    if pages < 1:
        raise ConfigError(f"{field}={size!r} holds no page of {page_size} tokens ({bytes_per_page} bytes)")
    return pages
