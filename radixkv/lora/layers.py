"""`LoRALinear`: a base linear plus each segment's own adapter delta; `apply_lora` wraps a model's."""

from __future__ import annotations

import torch
from torch import nn

from radixkv.errors import ConfigError
from radixkv.kernels.reference import lora_sgmv_reference
from radixkv.lora.grouped import lora_grouped
from radixkv.lora.pool import LoRASlots


class LoRALinear(nn.Module):
    """`base(x)` (T, in) -> (T, out), plus, for each segment of the slots' current batch with an
    adapter, `scaling * (x @ A.T) @ B.T` of that adapter's (fused) matrices for this linear."""

    def __init__(self, base: nn.Module, slots: LoRASlots, layer: int, fused: str):
        super().__init__()
        self.base = base
        self.key = (layer, fused)
        object.__setattr__(self, "slots", slots)  # shared by every LoRA linear: not a submodule

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.base(x)  # (T, out)
        batch = self.slots.batch
        if batch is None or not batch.adapted:
            return y
        a, b = self.slots.a[self.key], self.slots.b[self.key]
        if batch.seg_start is not None:
            from radixkv.kernels.lora_sgmv import lora_sgmv

            return lora_sgmv(y, x, a, b, self.slots.scaling, batch.seg_start, batch.seg_len, batch.seg_slot,
                             batch.max_len)
        if batch.groups is not None:
            return lora_grouped(y, x, a, b, self.slots.scaling, batch.groups)
        return lora_sgmv_reference(y, x, a, b, self.slots.scaling, batch.segments)


def apply_lora(model: nn.Module, slots: LoRASlots) -> int:
    """Wrap the fused linears `slots` serves in every layer of `model`; returns how many."""
    config = model.config
    if config.mla is not None or config.moe is not None:
        raise ConfigError(f"enable_lora: the {config.architecture} model's attention or MLP (MLA, MoE) takes no "
                          "LoRA adapters here yet")
    count = 0
    for i, layer in enumerate(model.layers):
        for owner in (layer.self_attn, layer.mlp):
            for fused in slots.fused:
                base = getattr(owner, fused, None)
                if base is not None:
                    setattr(owner, fused, LoRALinear(base, slots, i, fused))
                    count += 1
    return count
