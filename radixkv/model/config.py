"""ModelConfig: the architecture facts our model code needs, read from a Hugging Face config.json.

Supported, as transformers describes them:
- the Llama family: `LlamaForCausalLM`, `Qwen2ForCausalLM` (q/k/v bias, optional sliding window
  on upper layers), `Qwen3ForCausalLM` (per-head q/k RMSNorm), `MistralForCausalLM` (sliding
  window on every layer);
- `Gemma3ForCausalLM` (the text model: sliding layers interleaved with global ones, a RoPE base
  per kind, (1 + w) RMSNorm, sandwich norms, GELU-tanh, embeddings scaled by sqrt(hidden));
- multi-head latent attention (`MLAConfig`): `DeepseekV2ForCausalLM`, `DeepseekV3ForCausalLM`;
- mixture of experts (`MoEConfig`): DeepSeek V2/V3, `Qwen3MoeForCausalLM`, `MixtralForCausalLM`.

Both the older `rope_theta` / `rope_scaling` keys and the newer `rope_parameters` dict (also
per layer type, as Gemma 3's) are understood.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from radixkv.errors import ConfigError, ModelLoadError

SUPPORTED_ARCHITECTURES = (
    "LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM", "MistralForCausalLM",
    "Gemma3ForCausalLM", "DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM", "Qwen3MoeForCausalLM",
    "MixtralForCausalLM")
_MODEL_TYPES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM",
                "mistral": "MistralForCausalLM", "gemma3_text": "Gemma3ForCausalLM",
                "deepseek_v2": "DeepseekV2ForCausalLM", "deepseek_v3": "DeepseekV3ForCausalLM",
                "qwen3_moe": "Qwen3MoeForCausalLM", "mixtral": "MixtralForCausalLM"}
_QWEN = ("Qwen2ForCausalLM", "Qwen3ForCausalLM", "Qwen3MoeForCausalLM")
_DEEPSEEK = ("DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM")
ROPE_TYPES = ("default", "linear", "llama3", "yarn")
HIDDEN_ACTS = ("silu", "gelu_pytorch_tanh")
ROUTER_METHODS = ("greedy", "group_limited_greedy", "noaux_tc")


@dataclass(frozen=True)
class RopeConfig:
    """Rotary embedding parameters; `scaling` holds the type-specific factors."""

    theta: float = 10000.0
    rope_type: str = "default"
    scaling: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class MLAConfig:
    """Multi-head latent attention (DeepSeek V2/V3): a token's K and V are up-projected from one
    latent of `kv_lora_rank` values plus a `qk_rope_head_dim` RoPE key shared by every head."""

    q_lora_rank: int | None  # None: q straight from hidden (V2-Lite)
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    rope_interleave: bool = True  # RoPE pairs (x0, x1), (x2, x3), ... rather than halves

    @property
    def latent_dim(self) -> int:
        """What the KV pool stores per token and layer."""
        return self.kv_lora_rank + self.qk_rope_head_dim

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim


@dataclass(frozen=True)
class MoEConfig:
    """Mixture-of-experts MLP: routing and which layers have one.

    Routing: `scoring` (softmax or sigmoid) of the router logits; `method` picks the top-k
    (`greedy`; `group_limited_greedy`, the best `topk_group` of `n_group` expert groups by their
    best score; `noaux_tc`, V3's groups by their two best bias-corrected scores, the bias used
    for choosing only); `norm_topk_prob` renormalises the chosen weights; they are then scaled
    by `routed_scaling_factor`. `num_shared_experts` run on every token (DeepSeek)."""

    num_experts: int
    top_k: int
    intermediate_size: int  # per expert
    moe_layers: tuple[bool, ...]  # per layer: MoE (True) or the dense MLP
    scoring: str = "softmax"
    method: str = "greedy"
    norm_topk_prob: bool = False
    routed_scaling_factor: float = 1.0
    n_group: int = 1
    topk_group: int = 1
    num_shared_experts: int = 0


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
    mla: MLAConfig | None = None
    moe: MoEConfig | None = None
    # Gemma 3
    norm_offset: float = 0.0  # RMSNorm scales by (norm_offset + w): 1.0 for Gemma
    sandwich_norms: bool = False  # norms after attention and after the MLP too (Gemma 3)
    embed_scale: float = 1.0  # embeddings are multiplied by this (sqrt(hidden) for Gemma)
    query_scale: float | None = None  # attention scale; None: head_dim ** -0.5
    local_rope: RopeConfig | None = None  # RoPE of sliding-window layers, when it differs
    final_logit_softcapping: float | None = None

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
        if self.hidden_act not in HIDDEN_ACTS:
            raise ModelLoadError(f"hidden_act={self.hidden_act!r} is not supported (one of {HIDDEN_ACTS})")
        for rope in (self.rope, self.local_rope or self.rope):
            if rope.rope_type not in ROPE_TYPES:
                raise ModelLoadError(
                    f"rope type {rope.rope_type!r} is not supported; choose one of {ROPE_TYPES}"
                )
        if len(self.sliding_windows) != self.num_layers:
            raise ModelLoadError("sliding_windows must list one entry per layer")
        if self.moe is not None:
            m = self.moe
            if len(m.moe_layers) != self.num_layers:
                raise ModelLoadError("moe_layers must list one entry per layer")
            if not 1 <= m.top_k <= m.num_experts:
                raise ModelLoadError(f"num_experts_per_tok={m.top_k} must be in 1..{m.num_experts}")
            if m.method not in ROUTER_METHODS:
                raise ModelLoadError(f"topk_method={m.method!r} is not supported (one of {ROUTER_METHODS})")
            if m.scoring not in ("softmax", "sigmoid"):
                raise ModelLoadError(f"scoring_func={m.scoring!r} is not supported (softmax or sigmoid)")
            if m.num_experts % m.n_group or not 1 <= m.topk_group <= m.n_group:
                raise ModelLoadError(f"n_group={m.n_group} must divide n_routed_experts={m.num_experts} "
                                     f"and topk_group={m.topk_group} must be in 1..n_group")

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    @property
    def rope_dim(self) -> int:
        """Dimensions each rotated head has: `qk_rope_head_dim` for MLA, else `head_dim`."""
        return self.mla.qk_rope_head_dim if self.mla is not None else self.head_dim

    @property
    def kv_heads_and_dim(self) -> tuple[int, int, int | None]:
        """What the KV pool stores per token and layer: (heads, head_dim, the RoPE columns of
        a latent or None when K and V are stored)."""
        if self.mla is not None:
            return 1, self.mla.latent_dim, self.mla.qk_rope_head_dim
        return self.num_kv_heads, self.head_dim, None

    @property
    def linear_params(self) -> int:
        """Weights every token multiplies through: projections, MLP (the experts a token is
        routed to) and the LM head."""
        h = self.hidden_size
        if self.mla is not None:
            m = self.mla
            q_in = m.q_lora_rank or h
            attn = ((h * m.q_lora_rank if m.q_lora_rank else 0) + q_in * self.num_heads * m.qk_head_dim
                    + h * m.latent_dim + m.kv_lora_rank * self.num_heads * (m.qk_nope_head_dim + m.v_head_dim)
                    + self.num_heads * m.v_head_dim * h)
        else:
            attn = h * (self.q_size + 2 * self.kv_size) + self.q_size * h
        total = 0
        for layer in range(self.num_layers):
            inter = self.intermediate_size
            if self.moe is not None and self.moe.moe_layers[layer]:
                inter = self.moe.intermediate_size * (self.moe.top_k + self.moe.num_shared_experts)
            total += attn + 3 * h * inter
        return total + h * self.vocab_size

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
            mla = _parse_mla(cfg) if arch in _DEEPSEEK else None
            if mla is not None:
                head_dim = mla.qk_head_dim
            gemma = arch == "Gemma3ForCausalLM"
            if cfg.get("attn_logit_softcapping"):
                raise ModelLoadError("attn_logit_softcapping (Gemma 2) is not supported")
            rope, local_rope = _parse_rope(cfg, gemma)
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
                rope=rope,
                max_position_embeddings=int(cfg.get("max_position_embeddings", 4096)),
                tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
                attention_bias=bool(cfg.get("attention_bias", arch == "Qwen2ForCausalLM")),
                qk_norm=arch in ("Qwen3ForCausalLM", "Qwen3MoeForCausalLM", "Gemma3ForCausalLM"),
                sliding_windows=_parse_windows(cfg, arch, num_layers),
                bos_token_id=cfg.get("bos_token_id"),
                eos_token_ids=eos_ids,
                hidden_act=cfg.get("hidden_activation") or cfg.get("hidden_act", "silu"),
                mla=mla,
                moe=_parse_moe(cfg, arch, num_layers),
                norm_offset=1.0 if gemma else 0.0,
                sandwich_norms=gemma,
                embed_scale=hidden**0.5 if gemma else 1.0,
                query_scale=float(cfg.get("query_pre_attn_scalar", head_dim)) ** -0.5 if gemma else None,
                local_rope=local_rope,
                final_logit_softcapping=cfg.get("final_logit_softcapping"),
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


def _parse_rope(cfg: dict[str, Any], gemma: bool = False) -> tuple[RopeConfig, RopeConfig | None]:
    """The global RoPE and, for Gemma 3, the sliding layers' own (`rope_local_base_freq`)."""
    params = dict(cfg.get("rope_parameters") or {})
    if gemma:
        if "full_attention" in params:  # transformers 5: one dict per layer type
            local = params.get("sliding_attention") or {}
            params = dict(params["full_attention"])
        else:
            local = {"rope_theta": cfg.get("rope_local_base_freq", 10000.0)}
        return _rope_of(cfg, params), _rope_of({}, dict(local))
    return _rope_of(cfg, params), None


def _rope_of(cfg: dict[str, Any], params: dict[str, Any]) -> RopeConfig:
    scaling = dict(cfg.get("rope_scaling") or {})
    merged = {**scaling, **params}
    theta = float(merged.pop("rope_theta", cfg.get("rope_theta", 10000.0)))
    rope_type = merged.pop("rope_type", merged.pop("type", "default")) or "default"
    return RopeConfig(theta=theta, rope_type=rope_type, scaling=merged)


def _parse_mla(cfg: dict[str, Any]) -> MLAConfig:
    q_rank = cfg.get("q_lora_rank")
    return MLAConfig(
        q_lora_rank=int(q_rank) if q_rank else None,
        kv_lora_rank=int(cfg["kv_lora_rank"]),
        qk_nope_head_dim=int(cfg["qk_nope_head_dim"]),
        qk_rope_head_dim=int(cfg["qk_rope_head_dim"]),
        v_head_dim=int(cfg["v_head_dim"]),
        # V2 rotates interleaved pairs (complex multiply); V3 says so with `rope_interleave`
        rope_interleave=bool(cfg.get("rope_interleave", True)),
    )


def _parse_moe(cfg: dict[str, Any], arch: str, num_layers: int) -> MoEConfig | None:
    """The mixture-of-experts part of `cfg`, or None when no layer has experts."""
    moe = _parse_moe_fields(cfg, arch, num_layers)
    return moe if moe is not None and any(moe.moe_layers) else None


def _parse_moe_fields(cfg: dict[str, Any], arch: str, num_layers: int) -> MoEConfig | None:
    if arch in _DEEPSEEK:
        experts = cfg.get("n_routed_experts")
        if not experts:
            return None
        first_dense = int(cfg.get("first_k_dense_replace") or 0)
        freq = int(cfg.get("moe_layer_freq") or 1)
        v3 = arch == "DeepseekV3ForCausalLM"
        return MoEConfig(
            num_experts=int(experts), top_k=int(cfg["num_experts_per_tok"]),
            intermediate_size=int(cfg["moe_intermediate_size"]),
            moe_layers=tuple(i >= first_dense and i % freq == 0 for i in range(num_layers)),
            scoring=cfg.get("scoring_func") or ("sigmoid" if v3 else "softmax"),
            method="noaux_tc" if v3 else (cfg.get("topk_method") or "greedy"),
            norm_topk_prob=bool(cfg.get("norm_topk_prob", False)),
            routed_scaling_factor=float(cfg.get("routed_scaling_factor") or 1.0),
            n_group=int(cfg.get("n_group") or 1), topk_group=int(cfg.get("topk_group") or 1),
            num_shared_experts=int(cfg.get("n_shared_experts") or 0))
    if arch == "Qwen3MoeForCausalLM":
        step = int(cfg.get("decoder_sparse_step") or 1)
        dense = set(cfg.get("mlp_only_layers") or ())
        return MoEConfig(
            num_experts=int(cfg.get("num_experts") or cfg["num_local_experts"]), top_k=int(cfg["num_experts_per_tok"]),
            intermediate_size=int(cfg["moe_intermediate_size"]),
            moe_layers=tuple(i not in dense and (i + 1) % step == 0 for i in range(num_layers)),
            norm_topk_prob=bool(cfg.get("norm_topk_prob", False)))
    if arch == "MixtralForCausalLM":
        return MoEConfig(
            num_experts=int(cfg["num_local_experts"]), top_k=int(cfg["num_experts_per_tok"]),
            intermediate_size=int(cfg["intermediate_size"]), moe_layers=(True,) * num_layers,
            norm_topk_prob=True)
    return None


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
    unsupported = [what for what, present in (("multi-head latent attention (MLA)", config.mla),
                                              ("mixture-of-experts layers", config.moe)) if present]
    if unsupported:
        raise ConfigError(
            f"tp_size={tp_size}: tensor parallelism does not support {' or '.join(unsupported)} "
            f"yet ({config.architecture}, {source}); run it with tp_size=1. Tensor parallelism runs "
            f"Llama, Qwen2, Qwen3, Mistral and Gemma 3")
    problems = [f"{name}={value}" for name, value in (
        ("num_attention_heads", config.num_heads), ("num_key_value_heads", config.num_kv_heads),
        ("intermediate_size", config.intermediate_size)) if value % tp_size]
    if problems:
        raise ConfigError(
            f"tp_size={tp_size} does not divide {', '.join(problems)} of {source}: every rank must hold "
            f"as many attention heads, KV heads and MLP columns as the others; choose a tp_size that "
            f"divides num_key_value_heads={config.num_kv_heads} and num_attention_heads={config.num_heads}")
