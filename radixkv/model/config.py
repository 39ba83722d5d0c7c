"""ModelConfig: the architecture facts our model code needs, read from a Hugging Face config.json.

Supports the Llama family as transformers describes it: `LlamaForCausalLM`,
`Qwen2ForCausalLM` (q/k/v bias, optional sliding window on upper layers) and
`MistralForCausalLM` (sliding window on every layer). Both the older `rope_theta` /
`rope_scaling` keys and the newer `rope_parameters` dict are understood.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from radixkv.errors import ConfigError, ModelLoadError

SUPPORTED_ARCHITECTURES = ("LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM", "MistralForCausalLM")
_MODEL_TYPES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM",
                "mistral": "MistralForCausalLM"}
_QWEN = ("Qwen2ForCausalLM", "Qwen3ForCausalLM")
ROPE_TYPES = ("default", "linear", "llama3")


@dataclass(frozen=True)
class RopeConfig:
    """Rotary embedding parameters; `scaling` holds the type-specific factors."""

    theta: float = 10000.0
    rope_type: str = "default"
    scaling: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class ModelConfig:
    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope: RopeConfig
    max_position_embeddings: int
    tie_word_embeddings: bool = False
    attention_bias: bool = False  # bias on q/k/v projections (Qwen2)
    qk_norm: bool = False  # RMSNorm over each head of q and k before RoPE (Qwen3)
    sliding_windows: tuple[int | None, ...] = ()  # per layer; None = full attention
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    hidden_act: str = "silu"

    def __post_init__(self) -> None:
        if self.architecture not in SUPPORTED_ARCHITECTURES:
            raise ModelLoadError(
                f"unsupported architecture {self.architecture!r}; radixkv runs "
                f"{', '.join(SUPPORTED_ARCHITECTURES)}"
            )
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_layers",
                     "num_heads", "num_kv_heads", "head_dim"):
            if getattr(self, name) < 1:
                raise ModelLoadError(f"config field {name} must be >= 1, got {getattr(self, name)}")
        if self.num_heads % self.num_kv_heads:
            raise ModelLoadError(
                f"num_attention_heads={self.num_heads} is not a multiple of "
                f"num_key_value_heads={self.num_kv_heads}"
            )
        if self.hidden_act != "silu":
            raise ModelLoadError(f"hidden_act={self.hidden_act!r} is not supported (only 'silu')")
        if self.rope.rope_type not in ROPE_TYPES:
            raise ModelLoadError(
                f"rope type {self.rope.rope_type!r} is not supported; choose one of {ROPE_TYPES}"
            )
        if len(self.sliding_windows) != self.num_layers:
            raise ModelLoadError("sliding_windows must list one entry per layer")

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    @property
    def linear_params(self) -> int:
        """Weights every token multiplies through: projections, MLP and the LM head."""
        per_layer = (self.hidden_size * (self.q_size + 2 * self.kv_size) + self.q_size * self.hidden_size
                     + 3 * self.hidden_size * self.intermediate_size)
        return self.num_layers * per_layer + self.hidden_size * self.vocab_size

    @property
    def attention_scale(self) -> float:
        """Depth (tokens) at which a token's attention FLOPs equal its linear-layer FLOPs.

        Linear: 2 * linear_params per token. Attention at depth d: 4 * d * num_heads * head_dim
        per layer (scores and weighted values). Recomputing a token at depth d costs
        `1 + d / attention_scale` linear-layer units.
        """
        return self.linear_params / (2 * self.num_heads * self.head_dim * self.num_layers)

    @classmethod
    def from_dict(cls, cfg: dict[str, Any], source: str = "config") -> ModelConfig:
        """Parse a transformers config dict; errors name `source` and the field at fault."""
        arch = (cfg.get("architectures") or [None])[0] or _MODEL_TYPES.get(cfg.get("model_type", ""))
        if arch is None:
            raise ModelLoadError(f"{source}: neither 'architectures' nor a known 'model_type' is set")
        try:
            num_layers = int(cfg["num_hidden_layers"])
            num_heads = int(cfg["num_attention_heads"])
            hidden = int(cfg["hidden_size"])
            num_kv = int(cfg.get("num_key_value_heads") or num_heads)
            head_dim = int(cfg.get("head_dim") or hidden // num_heads)
            eos = cfg.get("eos_token_id")
            eos_ids = tuple(eos) if isinstance(eos, list) else (() if eos is None else (int(eos),))
            return cls(
                architecture=arch,
                vocab_size=int(cfg["vocab_size"]),
                hidden_size=hidden,
                intermediate_size=int(cfg["intermediate_size"]),
                num_layers=num_layers,
                num_heads=num_heads,
                num_kv_heads=num_kv,
                head_dim=head_dim,
                rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
                rope=_parse_rope(cfg),
                max_position_embeddings=int(cfg.get("max_position_embeddings", 4096)),
                tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
                attention_bias=bool(cfg.get("attention_bias", arch == "Qwen2ForCausalLM")),
                qk_norm=arch == "Qwen3ForCausalLM",
                sliding_windows=_parse_windows(cfg, arch, num_layers),
                bos_token_id=cfg.get("bos_token_id"),
                eos_token_ids=eos_ids,
                hidden_act=cfg.get("hidden_act", "silu"),
            )
        except KeyError as e:
            raise ModelLoadError(f"{source}: required field {e.args[0]!r} is missing") from None
        except (TypeError, ValueError) as e:
            if isinstance(e, ModelLoadError):
                raise ModelLoadError(f"{source}: {e}") from None
            raise ModelLoadError(f"{source}: bad value ({e})") from None

    @classmethod
    def from_file(cls, path: str | Path) -> ModelConfig:
        path = Path(path)
        try:
            cfg = json.loads(path.read_text())
        except FileNotFoundError:
            raise ModelLoadError(f"model config not found: {path}") from None
        except json.JSONDecodeError as e:
            raise ModelLoadError(f"{path}: not valid JSON ({e})") from None
        return cls.from_dict(cfg, source=str(path))


def _parse_rope(cfg: dict[str, Any]) -> RopeConfig:
    params = dict(cfg.get("rope_parameters") or {})
    scaling = dict(cfg.get("rope_scaling") or {})
    merged = {**scaling, **params}
    theta = float(merged.pop("rope_theta", cfg.get("rope_theta", 10000.0)))
    rope_type = merged.pop("rope_type", merged.pop("type", "default")) or "default"
    return RopeConfig(theta=theta, rope_type=rope_type, scaling=merged)


def _parse_windows(cfg: dict[str, Any], arch: str, num_layers: int) -> tuple[int | None, ...]:
    window = cfg.get("sliding_window")
    layer_types = cfg.get("layer_types")
    if layer_types:
        if len(layer_types) != num_layers:
            raise ModelLoadError(f"layer_types has {len(layer_types)} entries for {num_layers} layers")
        return tuple(window if t == "sliding_attention" and window else None for t in layer_types)
    if not window:
        return (None,) * num_layers
    if arch in _QWEN:
        if not cfg.get("use_sliding_window", False):
            return (None,) * num_layers
        first = int(cfg.get("max_window_layers", num_layers))
        return tuple(window if i >= first else None for i in range(num_layers))
    return (int(window),) * num_layers


def check_tp_size(config: ModelConfig, tp_size: int, source: str = "the model") -> None:
    """Raise `ConfigError` unless `tp_size` splits the heads, KV heads and MLP of `config`."""
    if tp_size == 1:
        return
    problems = [f"{name}={value}" for name, value in (
        ("num_attention_heads", config.num_heads), ("num_key_value_heads", config.num_kv_heads),
        ("intermediate_size", config.intermediate_size)) if value % tp_size]
    if problems:
        raise ConfigError(
            f"tp_size={tp_size} does not divide {', '.join(problems)} of {source}: every rank must hold "
            f"as many attention heads, KV heads and MLP columns as the others; choose a tp_size that "
            f"divides num_key_value_heads={config.num_kv_heads} and num_attention_heads={config.num_heads}")
