"""The adapters a server knows (in host memory) and the device slots a batch's adapters occupy.

`LoRASlots` holds, per layer and fused base linear (qkv_proj, o_proj, gate_up_proj,
down_proj), A (S, P * R, in) and B (S, out, P * R) for S = `max_loras_per_batch` slots at rank
R = `max_lora_rank`, P the parts fused (3 for q/k/v): part p's A rows [p * R, p * R + r) and B
block [its output rows, p * R...]. A slot is zero where its adapter has no weight, so an
adapter of lower rank or fewer targets is exact. `prepare` puts a batch's adapters in slots
(least recently used slots reused) and records the batch's segments for the LoRA linears.

`LoRAManager` keeps the adapters by name (`load`, `unload`; the scheduler's thread only).
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

import torch

from radixkv.config.lora import DEFAULT_LORA_RANK, LORA_TARGETS
from radixkv.lora.adapter import LoRAAdapter, LoRAError, load_adapter, module_shapes
from radixkv.lora.grouped import Groups

logger = logging.getLogger(__name__)
FUSED = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "o_proj": ("o_proj",),
         "gate_up_proj": ("gate_proj", "up_proj"), "down_proj": ("down_proj",)}
"""Each fused linear of the base model and the adapter modules it holds, in output order."""


@dataclass
class LoRABatch:
    """One forward's rows by adapter: (start token, tokens, slot) runs; slot -1: the base model."""

    segments: list[tuple[int, int, int]]
    seg_start: torch.Tensor | None = None  # (G,) int64 on the device: for the Triton kernels
    seg_len: torch.Tensor | None = None
    seg_slot: torch.Tensor | None = None
    max_len: int = 0
    groups: Groups | None = None  # the rows by adapter, for the batched torch path (`lora.grouped`)

    @property
    def adapted(self) -> bool:
        return any(slot >= 0 for _, _, slot in self.segments)


class LoRASlots:
    def __init__(self, mc, targets: list[str], slots: int, rank: int, device: torch.device, dtype: torch.dtype,
                 use_triton: bool = False):
        self.num_slots, self.rank, self.device, self.dtype = slots, rank, device, dtype
        self.targets = set(targets)
        self.use_triton = use_triton
        shapes = module_shapes(mc)
        self.fused = {f: parts for f, parts in FUSED.items() if self.targets & set(parts)}
        self.a: dict[tuple[int, str], torch.Tensor] = {}
        self.b: dict[tuple[int, str], torch.Tensor] = {}
        self.out_offsets = {f: [sum(shapes[q][1] for q in parts[:i]) for i in range(len(parts))]
                            for f, parts in self.fused.items()}
        for layer in range(mc.num_layers):
            for f, parts in self.fused.items():
                d_in, d_out = shapes[parts[0]][0], sum(shapes[p][1] for p in parts)
                self.a[(layer, f)] = torch.zeros((slots, len(parts) * rank, d_in), dtype=dtype, device=device)
                self.b[(layer, f)] = torch.zeros((slots, d_out, len(parts) * rank), dtype=dtype, device=device)
        self.scaling = torch.zeros(slots, dtype=torch.float32, device=device)
        self.resident: OrderedDict[str, int] = OrderedDict()  # adapter id -> slot, least recently used first
        self.batch: LoRABatch | None = None
        self.loads = 0

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (*self.a.values(), *self.b.values()))

    def _fill(self, slot: int, adapter: LoRAAdapter) -> None:
        R = self.rank
        for (layer, f), a in self.a.items():
            b = self.b[(layer, f)]
            a[slot].zero_()
            b[slot].zero_()
            for i, part in enumerate(self.fused[f]):
                w = adapter.weights.get((layer, part))
                if w is None:
                    continue
                wa, wb = w
                r, out = wa.shape[0], wb.shape[0]
                off = self.out_offsets[f][i]
                a[slot, i * R:i * R + r].copy_(wa)
                b[slot, off:off + out, i * R:i * R + r].copy_(wb)
        self.scaling[slot] = adapter.scaling
        self.loads += 1

    def prepare(self, rows: list[tuple[int, LoRAAdapter | None]]) -> None:
        """The next forward's rows, in order: (tokens, adapter or None); at most `num_slots`
        distinct adapters. Puts them in slots and records the segments."""
        wanted = {a.id: a for _, a in rows if a is not None}
        if len(wanted) > self.num_slots:
            raise LoRAError(f"a batch holds {len(wanted)} adapters, more than max_loras_per_batch={self.num_slots}")
        for aid, adapter in wanted.items():
            if aid in self.resident:
                self.resident.move_to_end(aid)
                continue
            used = set(self.resident.values())
            free = [s for s in range(self.num_slots) if s not in used]
            if free:
                slot = free[0]
            else:  # the least recently used adapter not in this batch gives its slot up
                victim = next(v for v in self.resident if v not in wanted)
                slot = self.resident.pop(victim)
            self._fill(slot, adapter)
            self.resident[aid] = slot
        segments: list[tuple[int, int, int]] = []
        start = 0
        for n, adapter in rows:
            slot = -1 if adapter is None else self.resident[adapter.id]
            if segments and segments[-1][2] == slot:
                s, length, _ = segments[-1]
                segments[-1] = (s, length + n, slot)
            elif n:
                segments.append((start, n, slot))
            start += n
        batch = LoRABatch(segments)
        if not self.use_triton and batch.adapted:
            batch.groups = Groups.of(segments, self.device, self.dtype)
        if self.use_triton and batch.adapted:
            as_tensor = lambda i: torch.tensor([s[i] for s in segments], dtype=torch.int64, device=self.device)  # noqa: E731
            batch.seg_start, batch.seg_len, batch.seg_slot = as_tensor(0), as_tensor(1), as_tensor(2)
            batch.max_len = max(s[1] for s in segments)
        self.batch = batch

    def forget(self, adapter_id: str) -> None:
        self.resident.pop(adapter_id, None)


class LoRAManager:
    """The adapters by name, over the slots the model's LoRA linears read (see the module docstring)."""

    def __init__(self, config, mc, device: torch.device, dtype: torch.dtype, use_triton: bool = False):
        lora = config.lora
        self.mc, self.dtype = mc, dtype
        initial = [load_adapter(name, path, mc, dtype) for name, path in lora.adapters]
        targets = lora.targets_given or sorted({t for a in initial for t in a.targets}) or list(LORA_TARGETS)
        rank = lora.max_lora_rank or max([a.rank for a in initial], default=DEFAULT_LORA_RANK)
        self.slots = LoRASlots(mc, targets, lora.max_loras_per_batch, rank, device, dtype, use_triton)
        self.adapters: dict[str, LoRAAdapter] = {}
        for adapter in initial:
            self._admit(adapter)
        logger.info("LoRA: %d adapter(s) loaded; %d slots of rank %d over %s (%.1f MiB)", len(self.adapters),
                    lora.max_loras_per_batch, rank, ", ".join(sorted(self.slots.targets)), self.slots.nbytes / 2**20)

    def _admit(self, adapter: LoRAAdapter) -> None:
        if adapter.rank > self.slots.rank:
            raise LoRAError(f"LoRA adapter {adapter.name!r}: rank {adapter.rank} exceeds --max-lora-rank "
                            f"{self.slots.rank}")
        outside = adapter.targets - self.slots.targets
        if outside:
            raise LoRAError(f"LoRA adapter {adapter.name!r} targets {sorted(outside)}, outside "
                            f"--lora-target-modules {sorted(self.slots.targets)}")
        self.adapters[adapter.name] = adapter

    def load(self, name: str, path: str) -> LoRAAdapter:
        """Load the adapter at `path` as `name`; raises `LoRAError` (the server keeps serving)."""
        if not isinstance(name, str) or not name or "=" in name or ":" in name or len(name) > 128:
            raise LoRAError(f"lora_name={name!r}: 1-128 characters without '=' or ':'")
        if name in self.adapters:
            raise LoRAError(f"lora_name={name!r}: an adapter of that name is loaded; unload it first")
        if not isinstance(path, str) or not path:
            raise LoRAError("lora_path: give the adapter's directory")
        adapter = load_adapter(name, Path(path), self.mc, self.dtype)
        self._admit(adapter)
        logger.info("LoRA adapter %r loaded from %s (rank %d)", name, path, adapter.rank)
        return adapter

    def unload(self, name: str) -> LoRAAdapter:
        adapter = self.adapters.pop(name, None)
        if adapter is None:
            raise LoRAError(f"lora_name={name!r}: no adapter of that name is loaded")
        if not any(a.id == adapter.id for a in self.adapters.values()):
            self.slots.forget(adapter.id)
        logger.info("LoRA adapter %r unloaded", name)
        return adapter

    def by_id(self, adapter_id: str) -> LoRAAdapter | None:
        return next((a for a in self.adapters.values() if a.id == adapter_id), None)

    def listing(self) -> dict[str, str]:
        """name -> id of every loaded adapter."""
        return {name: a.id for name, a in self.adapters.items()}
