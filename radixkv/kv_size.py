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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from radixkv.errors import ConfigError
from radixkv.kv_bytes import (  # noqa: F401  (the calculator's public names)
    FLOAT_KV_DTYPES,
    INT4_GROUP,
    KV_DTYPES,
    bytes_per_head,
    canonical_kv_dtype,
    element_dtype,
    format_bytes,
    int4_group,
    parse_size,
)

DEFAULT_CONTEXT = 4096
"""Tokens per request when neither the caller nor the config (max_position_embeddings) says."""


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
    """The parsed config.json of a model directory or config file (or `default`: the runtime's
    default model), and the file's path."""
    if str(model_or_config) == "default":
        from radixkv.model.model_dir import resolve_model_dir

        model_or_config = resolve_model_dir(None)
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
    """The KV geometry of a config dict, model directory, config.json path or `default`.

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
        dtype = element_dtype(value)
        if dtype is None:
            raise ConfigError(f"{field.source}: {field.prefix}{name} {value!r} is not a floating "
                              f"dtype the calculator knows ({', '.join(FLOAT_KV_DTYPES)})")
        return dtype
    return "float32"


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
