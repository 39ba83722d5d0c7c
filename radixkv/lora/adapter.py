"""A PEFT LoRA checkpoint (`adapter_config.json` + `adapter_model.safetensors`), read and checked.

Everything a checkpoint may hold that this runtime would not apply exactly is refused by name
(DoRA, biases, modules_to_save, fan_in_fan_out, per-module rank or alpha patterns, a target
outside the attention and MLP projections), so an adapter either gives the tokens its merged
model gives or does not load. `id` is a digest of the config and weights: the cache namespace
of its requests (the same weights loaded under another name, or again, share their cache).
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path

import torch

from radixkv.config.lora import LORA_TARGETS
from radixkv.errors import InvalidRequestError

KEY = re.compile(r"(?:^|\.)layers\.(\d+)\.(?:self_attn|mlp)\.(" + "|".join(LORA_TARGETS) + r")\.lora_([AB])\.weight$")
REFUSED = {"use_dora": "DoRA adapters", "modules_to_save": "modules_to_save (trained copies of whole modules)",
           "rank_pattern": "per-module ranks (rank_pattern)", "alpha_pattern": "per-module alphas (alpha_pattern)",
           "fan_in_fan_out": "fan_in_fan_out weights"}


class LoRAError(InvalidRequestError):
    """An adapter that cannot load (the message names the adapter and why)."""


@dataclass
class LoRAAdapter:
    name: str
    id: str  # digest of config + weights
    rank: int
    scaling: float  # lora_alpha / rank (rsLoRA: / sqrt(rank))
    weights: dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]]  # (layer, module) -> A (r, in), B (out, r)
    path: str = ""

    @property
    def targets(self) -> set[str]:
        return {module for _, module in self.weights}


def module_shapes(mc) -> dict[str, tuple[int, int]]:
    """(in, out) of each target module of the base model `mc` (a `ModelConfig`)."""
    h, q, kv, i = mc.hidden_size, mc.num_heads * mc.head_dim, mc.num_kv_heads * mc.head_dim, mc.intermediate_size
    return {"q_proj": (h, q), "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (q, h),
            "gate_proj": (h, i), "up_proj": (h, i), "down_proj": (i, h)}


def load_adapter(name: str, path: str | Path, mc, dtype: torch.dtype) -> LoRAAdapter:
    """Read `path` (a PEFT LoRA directory) for a base model of config `mc`; raises `LoRAError`."""
    directory = Path(path)

    def bad(why: str) -> LoRAError:
        return LoRAError(f"LoRA adapter {name!r} ({path}): {why}")

    config_file, weights_file = directory / "adapter_config.json", directory / "adapter_model.safetensors"
    if not directory.is_dir():
        raise bad("not a directory")
    if not config_file.is_file() or not weights_file.is_file():
        raise bad("needs adapter_config.json and adapter_model.safetensors (PEFT's save_pretrained)")
    try:
        raw = config_file.read_bytes()
        config = json.loads(raw)
    except (OSError, ValueError) as e:
        raise bad(f"adapter_config.json is not JSON: {e}") from None
    if not isinstance(config, dict) or config.get("peft_type", "LORA") != "LORA":
        raise bad(f"peft_type {config.get('peft_type') if isinstance(config, dict) else None!r}: only LORA adapters load")
    for key, what in REFUSED.items():
        if config.get(key):
            raise bad(f"{what} are not supported ({key}={config[key]!r})")
    if config.get("bias", "none") != "none":
        raise bad(f"bias={config['bias']!r}: adapters with biases are not supported")
    rank, alpha = config.get("r"), config.get("lora_alpha")
    if not isinstance(rank, int) or isinstance(rank, bool) or rank < 1 or not isinstance(alpha, (int, float)):
        raise bad(f"r={rank!r}, lora_alpha={alpha!r}: need a positive integer rank and a numeric alpha")
    scaling = alpha / (rank ** 0.5 if config.get("use_rslora") else rank)
    try:
        from safetensors.torch import load_file

        tensors = load_file(str(weights_file))
    except Exception as e:  # noqa: BLE001 - any unreadable file is the adapter's fault
        raise bad(f"adapter_model.safetensors cannot be read: {e}") from None
    shapes, parts = module_shapes(mc), {}
    for key, t in tensors.items():
        m = KEY.search(key)
        if m is None:
            raise bad(f"weight {key!r} targets a module LoRA here cannot adapt (only {', '.join(LORA_TARGETS)})")
        layer, module, which = int(m.group(1)), m.group(2), m.group(3)
        if layer >= mc.num_layers:
            raise bad(f"weight {key!r}: the base model has {mc.num_layers} layers")
        d_in, d_out = shapes[module]
        want = (rank, d_in) if which == "A" else (d_out, rank)
        if tuple(t.shape) != want:
            raise bad(f"weight {key!r} has shape {tuple(t.shape)}; the base model's {module} needs {want} "
                      "(another base model, or a rank other than r)")
        if not torch.isfinite(t).all():
            raise bad(f"weight {key!r} holds NaN or infinity")
        parts.setdefault((layer, module), {})[which] = t.to(dtype)
    weights = {}
    for (layer, module), ab in parts.items():
        if set(ab) != {"A", "B"}:
            raise bad(f"layer {layer} {module}: lora_A and lora_B must come together")
        weights[(layer, module)] = (ab["A"].contiguous(), ab["B"].contiguous())
    if not weights:
        raise bad("holds no LoRA weight")
    digest = hashlib.sha256(raw + weights_file.read_bytes()).hexdigest()[:20]
    return LoRAAdapter(name, digest, rank, float(scaling), weights, str(path))
