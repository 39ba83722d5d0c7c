"""What a user names as the model -- nothing (the embedded default model), a name in
`gguf.NAMED_MODELS`, a GGUF file, or a model directory -- as a directory of config.json +
*.safetensors (+ tokenizer files).

No torch here: the HTTP process resolves the model (and the tokenizer's files) while the
scheduler process, which alone runs the model, loads torch.
"""

from __future__ import annotations

from pathlib import Path

from radixkv.errors import ModelLoadError


def resolve_model_dir(model: str | Path | None, cache_dir: str | Path | None = None) -> Path:
    """A directory holding config.json and safetensors weights for `model`.

    `None` is the embedded default model (SmolLM2-135M-Instruct, converted once and cached);
    a name in `gguf.NAMED_MODELS` (`gemma3-270m`) is its installed package's GGUF; a `.gguf`
    file is converted once into the cache; a directory is used as is.
    """
    from radixkv.model import gguf

    if model is None:
        return gguf.default_model_dir(cache_dir)
    if str(model) in gguf.NAMED_MODELS and not Path(model).exists():
        return gguf.convert_gguf_cached(gguf.NAMED_MODELS[str(model)].gguf_path(cache_dir), cache_dir)
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
        f"model {str(model)!r} is neither a model directory, a .gguf file nor one of "
        f"{sorted(gguf.NAMED_MODELS)} (nothing is downloaded: give a local path, or no model for "
        "the embedded default)"
    )


def safetensors_files(model_dir: Path) -> list[Path]:
    return sorted(model_dir.glob("*.safetensors"))
