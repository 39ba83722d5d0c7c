"""What a model's KV cache costs: bytes per token, per request, and tokens fitting a memory.

Pure arithmetic on a Hugging Face `config.json` (a dict, a model directory or the file itself);
no torch, no weights, fast to import.

Per token, every layer stores (element counts, before the dtype's bytes):

- MHA / GQA / MQA: K and V, each `kv_heads * head_dim`, so `2 * layers * kv_heads * head_dim`.
  `kv_heads` is `num_key_value_heads` (default `num_attention_heads`); `head_dim` is the
  config's `head_dim` if set, else `hidden_size // num_attention_heads`.
- MLA (DeepSeek-V2/V3: `kv_lora_rank` in the config): ONE compressed latent of
  `kv_lora_rank + qk_rope_head_dim` elements shared by K and V, so `layers * (rank + rope)`.
  It is reported as one KV "head" of that width.

Quantised layouts are those of the runtime's quantised pool, per token per KV head of each
stored tensor (K, V, or the MLA latent):

- int8: `head_dim` bytes + one float32 scale: `head_dim + 4`.
- int4: half a byte per element + a float16 (scale, minimum) pair per group of `INT4_GROUP`
  elements along `head_dim` (one group of `head_dim` if it does not divide):
  `head_dim // 2 + 4 * groups`; an odd `head_dim` is refused, as the pool refuses it.
- fp8 (e4m3 / e5m2): one byte per element; its per-tensor scale is negligible and not counted.

Sizes ignore the pool's padding page and page rounding: they are what the tokens themselves take.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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
DEFAULT_CONTEXT = 4096
"""Tokens per request when neither the caller nor the config (max_position_embeddings) says."""


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


@dataclass(frozen=True, slots=True)
class KVGeometry:
    """The dtype-independent shape of a model's KV cache, read from its config.

    For MLA, `kv_heads` is 1 and `head_dim` is `kv_lora_rank + qk_rope_head_dim` (the latent).
    """

    layers: int
    kv_heads: int
    head_dim: int
    attention: str  # "MHA", "GQA", "MQA" or "MLA"
    config_dtype: str  # canonical KV dtype of the config's torch_dtype (float32 if absent)
    max_context: int | None  # max_position_embeddings, tokens
    source: str  # the file (or label) the config came from, for messages

    def __post_init__(self) -> None:
        for name in ("layers", "kv_heads", "head_dim"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{self.source}: {name} must be >= 1, got {getattr(self, name)}")
        if self.attention not in ("MHA", "GQA", "MQA", "MLA"):
            raise ConfigError(f"{self.source}: unknown attention kind {self.attention!r}")

    @property
    def tensors_per_layer(self) -> int:
        """Stored tensors per layer and token: K and V, or MLA's single latent."""
        return 1 if self.attention == "MLA" else 2

    @property
    def elements_per_token(self) -> int:
        return self.layers * self.tensors_per_layer * self.kv_heads * self.head_dim

    def bytes_per_head(self, kv_dtype: str) -> int:
        """Bytes of one (token, KV head) of one stored tensor in `kv_dtype` (not 'auto')."""
        if kv_dtype == "int4" and self.head_dim % 2:  # the pool packs two values per byte and refuses this too
            raise ConfigError(f"{self.source}: int4 KV needs an even head_dim, got {self.head_dim}")
        return bytes_per_head(kv_dtype, self.head_dim)

    def size(self, kv_dtype: str = "auto") -> KVSize:
        """The KV cost of this model stored as `kv_dtype` ('auto': the config's dtype)."""
        dtype = canonical_kv_dtype(kv_dtype)
        if dtype == "auto":
            dtype = self.config_dtype
        per_token = self.layers * self.tensors_per_layer * self.kv_heads * self.bytes_per_head(dtype)
        return KVSize(self, dtype, per_token)


@dataclass(frozen=True, slots=True)
class KVSize:
    """A model's KV cost in one dtype. Sizes in bytes, contexts in tokens."""

    geometry: KVGeometry
    kv_dtype: str  # canonical, never 'auto'
    bytes_per_token: int

    @property
    def layers(self) -> int:
        return self.geometry.layers

    @property
    def kv_heads(self) -> int:
        return self.geometry.kv_heads

    @property
    def head_dim(self) -> int:
        return self.geometry.head_dim

    @property
    def attention(self) -> str:
        return self.geometry.attention

    def bytes_per_request(self, context: int) -> int:
        """Bytes of one request holding `context` tokens of KV."""
        if context < 0:
            raise ConfigError(f"context must be >= 0 tokens, got {context}")
        return context * self.bytes_per_token

    def tokens_fitting(self, memory_bytes: int) -> int:
        """Whole tokens of KV that fit in `memory_bytes`."""
        if memory_bytes < 0:
            raise ConfigError(f"memory must be >= 0 bytes, got {memory_bytes}")
        return memory_bytes // self.bytes_per_token


def load_config(model_or_config: str | Path) -> tuple[dict[str, Any], str]:
    """The parsed config.json of a model directory or config file, and the file's path."""
    path = Path(model_or_config).expanduser()
    if path.is_dir():
        path = path / "config.json"
    if not path.is_file():
        raise ConfigError(f"{path}: no such config file (give a model directory or a config.json)")
    try:
        config = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ConfigError(f"{path}: not readable as JSON ({e})") from e
    if not isinstance(config, dict):
        raise ConfigError(f"{path}: expected a JSON object, got {type(config).__name__}")
    return config, str(path)


def read_kv_geometry(config: dict[str, Any] | str | Path, source: str = "config") -> KVGeometry:
    """The KV geometry of a config dict, model directory or config.json path.

    Multimodal configs are read through their nested `text_config`. Raises ConfigError naming
    the file (`source` for a dict) and the missing or invalid field.
    """
    if not isinstance(config, dict):
        config, source = load_config(config)
    text = config.get("text_config")
    prefix = ""
    if isinstance(text, dict) and "num_hidden_layers" not in config:
        set_fields = {k: v for k, v in text.items() if v is not None}
        prefix, fields = "text_config.", {**_dtype_fields(config), **set_fields}
    else:
        fields = config
    field = _FieldReader(fields, source, prefix)

    layers = field.positive_int("num_hidden_layers")
    if field.get("kv_lora_rank") is not None:
        kv_heads, attention = 1, "MLA"
        head_dim = field.positive_int("kv_lora_rank") + field.positive_int("qk_rope_head_dim")
    else:
        heads = field.positive_int("num_attention_heads")
        kv_heads = _kv_heads(field, heads)
        if heads % kv_heads:
            raise ConfigError(f"{source}: {prefix}num_attention_heads ({heads}) is not a multiple "
                              f"of the KV heads ({kv_heads})")
        if field.get("head_dim") is not None:
            head_dim = field.positive_int("head_dim")
        else:
            head_dim = field.positive_int("hidden_size") // heads
        attention = "MQA" if kv_heads == 1 else "MHA" if kv_heads == heads else "GQA"
    max_context = None
    if field.get("max_position_embeddings") is not None:
        max_context = field.positive_int("max_position_embeddings")
    return KVGeometry(layers, kv_heads, head_dim, attention, _config_dtype(field), max_context, source)


def kv_size(config: dict[str, Any] | str | Path, kv_dtype: str = "auto") -> KVSize:
    """The KV cost of a model (config dict, model directory or config.json) in `kv_dtype`."""
    return read_kv_geometry(config).size(kv_dtype)


def kv_bytes_per_token(config: dict[str, Any] | str | Path, kv_dtype: str = "auto") -> int:
    """Bytes of KV one token takes across every layer of the model, stored as `kv_dtype`."""
    return kv_size(config, kv_dtype).bytes_per_token


class _FieldReader:
    """Reads config fields, naming the file and the (possibly nested) field in every error."""

    def __init__(self, fields: dict[str, Any], source: str, prefix: str):
        self.fields, self.source, self.prefix = fields, source, prefix

    def get(self, name: str) -> Any:
        return self.fields.get(name)

    def positive_int(self, name: str) -> int:
        if name not in self.fields or self.fields[name] is None:
            raise ConfigError(f"{self.source}: {self.prefix}{name} missing")
        value = self.fields[name]
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"{self.source}: {self.prefix}{name} must be a positive integer, "
                              f"got {value!r}")
        return value


def _dtype_fields(config: dict[str, Any]) -> dict[str, Any]:
    """The top-level dtype of a multimodal config, which its text_config may not repeat."""
    return {k: config[k] for k in ("torch_dtype", "dtype") if config.get(k) is not None}


def _kv_heads(field: _FieldReader, heads: int) -> int:
    # Falcon names them num_kv_heads (new decoder architecture) or says multi_query: true.
    for name in ("num_key_value_heads", "num_kv_heads"):
        if field.get(name) is not None:
            return field.positive_int(name)
    return 1 if field.get("multi_query") is True else heads


def _config_dtype(field: _FieldReader) -> str:
    # transformers 5 writes `dtype`; earlier versions `torch_dtype`.
    for name in ("torch_dtype", "dtype"):
        value = field.get(name)
        if value is None:
            continue
        dtype = _DTYPE_ALIASES.get(str(value).lower(), str(value).lower())
        if dtype not in _ELEMENT_BYTES:
            raise ConfigError(f"{field.source}: {field.prefix}{name} {value!r} is not a floating "
                              f"dtype the calculator knows ({', '.join(_ELEMENT_BYTES)})")
        return dtype
    return "float32"


_SIZE_UNITS = {"": 1, "b": 1, "k": 1000, "kb": 1000, "m": 1000**2, "mb": 1000**2, "g": 1000**3,
               "gb": 1000**3, "t": 1000**4, "tb": 1000**4, "kib": 1024, "mib": 1024**2,
               "gib": 1024**3, "tib": 1024**4}


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


def kv_report(geometry: KVGeometry, kv_dtypes: list[str], *, context: int | None = None,
              batch: int = 1, memory_bytes: int | None = None) -> dict[str, Any]:
    """Sizes of `geometry` in each KV dtype, as a JSON-ready dict (bytes and tokens).

    `context` defaults to the config's max_position_embeddings, else `DEFAULT_CONTEXT`.
    """
    context = context or geometry.max_context or DEFAULT_CONTEXT
    rows = []
    for name in kv_dtypes:
        size = geometry.size(name)
        row = {"dtype": name, "kv_dtype": size.kv_dtype, "bytes_per_token": size.bytes_per_token,
               "bytes_per_request": size.bytes_per_request(context),
               "bytes_per_batch": batch * size.bytes_per_request(context)}
        if memory_bytes is not None:
            row["tokens_fitting"] = size.tokens_fitting(memory_bytes)
            row["requests_fitting"] = row["tokens_fitting"] // context
        rows.append(row)
    return {"config": geometry.source, "attention": geometry.attention, "layers": geometry.layers,
            "kv_heads": geometry.kv_heads, "head_dim": geometry.head_dim,
            "config_dtype": geometry.config_dtype, "context": context, "batch": batch,
            "memory_bytes": memory_bytes, "sizes": rows}


def format_report(report: dict[str, Any]) -> str:
    """A `kv_report` as a header line and an aligned table."""
    if report["attention"] == "MLA":
        heads = "1 latent"
    else:
        heads = f"{report['kv_heads']} KV head" + ("s" if report["kv_heads"] > 1 else "")
    lines = [f"{report['config']}: {report['attention']}, {report['layers']} layers x {heads} x "
             f"head_dim {report['head_dim']} (config dtype {report['config_dtype']})"]
    context, batch, memory = report["context"], report["batch"], report["memory_bytes"]
    header = ["dtype", "per token", f"per request ({context:,} tok)"]
    if batch != 1:
        header.append(f"batch of {batch}")
    if memory is not None:
        lines.append(f"memory: {memory:,} bytes ({format_bytes(memory)})")
        header += ["tokens fitting", f"requests of {context:,} tok"]
    table = [header]
    for row in report["sizes"]:
        label = row["dtype"] if row["dtype"] == row["kv_dtype"] else f"{row['dtype']} ({row['kv_dtype']})"
        cells = [label, format_bytes(row["bytes_per_token"]), format_bytes(row["bytes_per_request"])]
        if batch != 1:
            cells.append(format_bytes(row["bytes_per_batch"]))
        if memory is not None:
            cells += [f"{row['tokens_fitting']:,}", f"{row['requests_fitting']:,}"]
        table.append(cells)
    widths = [max(len(r[i]) for r in table) for i in range(len(header))]
    for r in table:
        cells = [r[0].ljust(widths[0])] + [c.rjust(w) for c, w in zip(r[1:], widths[1:])]
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines)
