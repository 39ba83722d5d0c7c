"""Load Hugging Face checkpoints (config.json + safetensors) into our model code.

`resolve_model_dir` turns what a user names -- nothing (the embedded default model), a GGUF
file, or a model directory -- into a directory of config.json + *.safetensors (+ tokenizer
files). `load_model` builds `LlamaForCausalLM` without initialising weights and fills every
parameter from the checkpoint, fusing q/k/v and gate/up; a missing, unexpected or misshapen
tensor is an error naming the file and the tensor.
"""

from __future__ import annotations

import re
from pathlib import Path

import torch
from safetensors import safe_open
from tqdm import tqdm

from radixkv.errors import ModelLoadError
from radixkv.model.config import ModelConfig
from radixkv.model.llama import LlamaForCausalLM

_LAYER = re.compile(r"^model\.layers\.(\d+)\.(.+)$")
_IGNORED = re.compile(r"(rotary_emb\.inv_freq|\.rotary_emb\.)")


def resolve_model_dir(model: str | Path | None, cache_dir: str | Path | None = None) -> Path:
    """A directory holding config.json and safetensors weights for `model`.

    `None` is the embedded default model (SmolLM2-135M-Instruct, converted once and cached);
    a `.gguf` file is converted once into the cache; a directory is used as is.
    """
    from radixkv.model import gguf

    if model is None:
        return gguf.default_model_dir(cache_dir)
    path = Path(model).expanduser()
    if path.is_file() and path.suffix == ".gguf":
        return gguf.convert_gguf_cached(path, cache_dir)
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ModelLoadError(f"model directory {path} has no config.json")
        if not safetensors_files(path):
            raise ModelLoadError(f"model directory {path} has no *.safetensors weights")
        return path
    raise ModelLoadError(
        f"model {str(model)!r} is neither a model directory nor a .gguf file "
        "(nothing is downloaded: give a local path, or no model for the embedded default)"
    )


def safetensors_files(model_dir: Path) -> list[Path]:
    return sorted(model_dir.glob("*.safetensors"))


class _Targets:
    """Where each checkpoint tensor goes: a parameter, or a row range of a fused one."""

    def __init__(self, model: LlamaForCausalLM, config: ModelConfig):
        params = dict(model.named_parameters())
        q, kv, inter = config.q_size, config.kv_size, config.intermediate_size
        self.slots: dict[str, tuple[torch.Tensor, slice | None]] = {}
        for name, p in params.items():
            if ".qkv_proj." in name:
                kind = name.rsplit(".", 1)[1]  # weight or bias
                base = "model." + name.replace(".qkv_proj." + kind, "")
                for proj, rows in (("q", slice(0, q)), ("k", slice(q, q + kv)),
                                   ("v", slice(q + kv, q + 2 * kv))):
                    self.slots[f"{base}.{proj}_proj.{kind}"] = (p, rows)
            elif ".gate_up_proj." in name:
                base = "model." + name.replace(".gate_up_proj.weight", "")
                self.slots[f"{base}.gate_proj.weight"] = (p, slice(0, inter))
                self.slots[f"{base}.up_proj.weight"] = (p, slice(inter, 2 * inter))
            elif name.startswith("lm_head."):
                self.slots[name] = (p, None)
            else:
                self.slots["model." + name] = (p, None)

    def target(self, name: str) -> torch.Tensor | None:
        slot = self.slots.get(name)
        if slot is None:
            return None
        param, rows = slot
        return param.data if rows is None else param.data[rows]


def load_model(
    model_dir: str | Path,
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
    progress: bool = True,
) -> LlamaForCausalLM:
    """Build the model described by `model_dir/config.json` and load its safetensors weights."""
    model_dir = Path(model_dir)
    config = ModelConfig.from_file(model_dir / "config.json")
    files = safetensors_files(model_dir)
    if not files:
        raise ModelLoadError(f"model directory {model_dir} has no *.safetensors weights")
    with torch.device("meta"):
        model = LlamaForCausalLM(config)
    model.to_empty(device=device)
    model.to(dtype)
    model.rotary.build_tables(device)
    targets = _Targets(model, config)
    filled: set[str] = set()
    with tqdm(total=len(targets.slots), desc="Loading weights", unit="tensor",
              disable=not progress, leave=False) as bar:
        for file in files:
            with safe_open(str(file), framework="pt", device="cpu") as f:
                for name in f.keys():
                    dest = targets.target(name)
                    if dest is None:
                        if _IGNORED.search(name) or (name == "lm_head.weight" and config.tie_word_embeddings):
                            continue
                        raise ModelLoadError(
                            f"{file}: unexpected tensor {name!r} for {config.architecture} "
                            f"(does config.json describe this checkpoint?)"
                        )
                    tensor = f.get_tensor(name)
                    if tuple(tensor.shape) != tuple(dest.shape):
                        raise ModelLoadError(
                            f"{file}: tensor {name!r} has shape {tuple(tensor.shape)}, "
                            f"config.json implies {tuple(dest.shape)}"
                        )
                    dest.copy_(tensor.to(dtype))
                    filled.add(name)
                    bar.update(1)
    missing = sorted(set(targets.slots) - filled)
    if missing:
        more = f" and {len(missing) - 5} more" if len(missing) > 5 else ""
        raise ModelLoadError(f"{model_dir}: missing tensor(s) {missing[:5]}{more}")
    return model.eval()
