"""Load Hugging Face checkpoints (config.json + safetensors) into our model code.

What a user names becomes a model directory in `radixkv.model.model_dir` (no torch there, so
the HTTP process resolves it without loading torch); `load_model` builds `LlamaForCausalLM` without initialising weights and fills every
parameter from the checkpoint, fusing q/k/v and gate/up; a missing, unexpected or misshapen
tensor is an error naming the file and the tensor.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open
from tqdm import tqdm

from radixkv.errors import ModelLoadError
from radixkv.model.config import ModelConfig
from radixkv.model.llama import LlamaForCausalLM
from radixkv.model.model_dir import resolve_model_dir, safetensors_files  # noqa: F401 (re-exported)
from radixkv.parallel.group import SingleRank
from radixkv.parallel.shard import TPShard

_LAYER = re.compile(r"^model\.layers\.(\d+)\.(.+)$")
_IGNORED = re.compile(r"(rotary_emb\.inv_freq|\.rotary_emb\.)")
_EXPERT = re.compile(r"^(model\.layers\.\d+\.mlp)\.experts\.(\d+)\.(gate_proj|up_proj|down_proj)\.weight$")
_MIXTRAL = re.compile(r"\.block_sparse_moe\.(?:experts\.(\d+)\.(w1|w2|w3)|gate)\.weight$")
_MIXTRAL_PROJ = {"w1": "gate_proj", "w3": "up_proj", "w2": "down_proj"}


def checkpoint_name(name: str) -> str:
    """A checkpoint tensor's name in the Hugging Face layout our targets use (Mixtral's
    `block_sparse_moe.experts.E.w1` is `mlp.experts.E.gate_proj`, and so on)."""
    m = _MIXTRAL.search(name)
    if m is None:
        return name
    head = name[: m.start()]
    if m.group(1) is None:
        return f"{head}.mlp.gate.weight"
    return f"{head}.mlp.experts.{m.group(1)}.{_MIXTRAL_PROJ[m.group(2)]}.weight"


@dataclass(frozen=True, slots=True)
class _Slot:
    """Where one checkpoint tensor goes: rows `dest_rows` of parameter `param` (all of it when
    None) receive `src[src_index]` (this rank's slice; all of it when None)."""

    param: torch.Tensor
    dest_rows: slice | tuple | None = None  # an index into param (rows, or (expert, rows))
    src_index: tuple[slice, ...] | None = None
    full_shape: tuple[int, ...] | None = None  # the checkpoint tensor's shape, when sliced


class _Targets:
    """Every checkpoint tensor this rank loads, and where (see `_Slot`).

    Fused q/k/v and gate/up receive their parts as row ranges. With tensor parallelism
    (`radixkv.parallel.shard`), column-parallel weights take this rank's rows of the checkpoint
    tensor, row-parallel weights its columns, and the embedding / output layer its vocabulary
    rows (zero-padded).
    """

    def __init__(self, model: LlamaForCausalLM, config: ModelConfig, shard: TPShard):
        params = dict(model.named_parameters())
        q, kv, hidden = config.q_size, config.kv_size, config.hidden_size
        q_loc, kv_loc = shard.local(q), shard.local(kv)
        first, stop, _ = shard.vocab_rows(config.vocab_size)
        whole = shard.size == 1
        self.slots: dict[str, _Slot] = {}

        def rows(n: int, cols: int | None) -> tuple[tuple[slice, ...] | None, tuple[int, ...]]:
            full = (n,) if cols is None else (n, cols)
            return (None if whole else (shard.part(n),)), full

        for name, p in params.items():
            if ".qkv_proj." in name:
                kind = name.rsplit(".", 1)[1]  # weight or bias
                base = "model." + name.replace(".qkv_proj." + kind, "")
                cols = hidden if kind == "weight" else None
                for proj, dest, n in (("q", slice(0, q_loc), q), ("k", slice(q_loc, q_loc + kv_loc), kv),
                                      ("v", slice(q_loc + kv_loc, q_loc + 2 * kv_loc), kv)):
                    self.slots[f"{base}.{proj}_proj.{kind}"] = _Slot(p, dest, *rows(n, cols))
            elif ".gate_up_proj." in name:
                base = "model." + name.replace(".gate_up_proj.weight", "")
                inter_loc = p.shape[0] // 2
                inter = inter_loc * shard.size
                self.slots[f"{base}.gate_proj.weight"] = _Slot(p, slice(0, inter_loc), *rows(inter, hidden))
                self.slots[f"{base}.up_proj.weight"] = _Slot(p, slice(inter_loc, 2 * inter_loc),
                                                             *rows(inter, hidden))
            elif name.endswith((".w_gate_up", ".w_down")):  # stacked experts: one tensor per expert
                base = "model." + name.rsplit(".", 1)[0]
                experts, out_dim, _ = p.shape
                for e in range(experts):
                    if name.endswith(".w_down"):
                        self.slots[f"{base}.experts.{e}.down_proj.weight"] = _Slot(p, (e,))
                    else:
                        half = out_dim // 2
                        self.slots[f"{base}.experts.{e}.gate_proj.weight"] = _Slot(p, (e, slice(0, half)))
                        self.slots[f"{base}.experts.{e}.up_proj.weight"] = _Slot(p, (e, slice(half, out_dim)))
            elif not whole and name.endswith((".o_proj.weight", ".down_proj.weight")):
                # row-parallel: this rank's input columns
                cols = p.shape[1] * shard.size
                self.slots["model." + name] = _Slot(p, None, (slice(None), shard.part(cols)), (hidden, cols))
            elif name in ("embed_tokens.weight", "lm_head.weight"):
                p.data.zero_()  # rows past the vocabulary stay zero
                key = name if name.startswith("lm_head.") else "model." + name
                self.slots[key] = _Slot(p, slice(0, stop - first), (slice(first, stop),),
                                        (config.vocab_size, hidden))
            else:
                self.slots["model." + name] = _Slot(p)

    def get(self, name: str) -> _Slot | None:
        return self.slots.get(name)


def _read(f, file: Path, name: str, slot: _Slot, dest: torch.Tensor) -> torch.Tensor:
    """This rank's part of tensor `name` in the open safetensors file `f` (shape-checked)."""
    view = f.get_slice(name)
    shape = tuple(view.get_shape())
    expected = slot.full_shape if slot.full_shape is not None else tuple(dest.shape)
    if shape != expected:
        raise ModelLoadError(f"{file}: tensor {name!r} has shape {shape}, config.json implies {expected}")
    return view[slot.src_index] if slot.src_index is not None else view[:]


def load_model(
    model_dir: str | Path,
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
    progress: bool = True,
    shard: TPShard = TPShard(),
    comm=SingleRank(),
) -> LlamaForCausalLM:
    """Build the model described by `model_dir/config.json` and load its safetensors weights.

    With a `shard` of a tensor-parallel group, only that rank's slices are read from disk
    (`comm` are the group's collectives)."""
    model_dir = Path(model_dir)
    config = ModelConfig.from_file(model_dir / "config.json")
    files = safetensors_files(model_dir)
    if not files:
        raise ModelLoadError(f"model directory {model_dir} has no *.safetensors weights")
    with torch.device("meta"):
        model = LlamaForCausalLM(config, shard, comm)
    model.to_empty(device=device)
    model.to(dtype)
    for rotary in (model.rotary, model.local_rotary):
        if rotary is not None:
            rotary.build_tables(device)
    targets = _Targets(model, config, shard)
    filled: set[str] = set()
    with tqdm(total=len(targets.slots), desc="Loading weights", unit="tensor",
              disable=not progress, leave=False) as bar:
        for file in files:
            with safe_open(str(file), framework="pt", device="cpu") as f:
                for stored in f.keys():
                    name = checkpoint_name(stored)
                    slot = targets.get(name)
                    if slot is None:
                        if _IGNORED.search(name) or (name == "lm_head.weight" and config.tie_word_embeddings):
                            continue
                        raise ModelLoadError(
                            f"{file}: unexpected tensor {name!r} for {config.architecture} "
                            f"(does config.json describe this checkpoint?)"
                        )
                    dest = slot.param.data if slot.dest_rows is None else slot.param.data[slot.dest_rows]
                    dest.copy_(_read(f, file, stored, slot, dest).to(dtype))
                    filled.add(name)
                    bar.update(1)
    missing = sorted(set(targets.slots) - filled)
    if missing:
        more = f" and {len(missing) - 5} more" if len(missing) > 5 else ""
        raise ModelLoadError(f"{model_dir}: missing tensor(s) {missing[:5]}{more}")
    if config.mla is not None and config.mla.rope_interleave:
        _deinterleave_mla_rope(model, config)
    model.finish_load()
    return model.eval()


def _deinterleave_mla_rope(model: LlamaForCausalLM, config: ModelConfig) -> None:
    """Reorder DeepSeek's interleaved RoPE rows into halves (see `radixkv.model.mla`)."""
    from radixkv.model.mla import deinterleave_rope_rows

    m = config.mla
    for layer in model.layers:
        attn = layer.self_attn
        q = attn.q_proj if m.q_lora_rank is None else attn.q_b_proj
        q.weight.data = deinterleave_rope_rows(q.weight.data, m.qk_head_dim, m.qk_rope_head_dim)
        kv = attn.kv_a_proj_with_mqa
        kv.weight.data = deinterleave_rope_rows(kv.weight.data, m.latent_dim, m.qk_rope_head_dim)
        if kv.bias is not None:
            kv.bias.data = deinterleave_rope_rows(kv.bias.data[:, None], m.latent_dim, m.qk_rope_head_dim)[:, 0]
