import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from radixkv.errors import ModelLoadError
from radixkv.model.loader import load_model, resolve_model_dir


def copy_dir(src, dst):
    dst.mkdir()
    for f in src.iterdir():
        (dst / f.name).write_bytes(f.read_bytes())
    return dst


def test_missing_config_and_weights_are_named(tmp_path, tiny_model_dir):
    with pytest.raises(ModelLoadError, match="neither a model directory, a .gguf file nor one of"):
        resolve_model_dir(tmp_path / "nope")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ModelLoadError, match="has no config.json"):
        resolve_model_dir(empty)
    no_weights = copy_dir(tiny_model_dir("llama"), tmp_path / "no_weights")
    (no_weights / "model.safetensors").unlink()
    with pytest.raises(ModelLoadError, match=r"no \*\.safetensors"):
        resolve_model_dir(no_weights)


def test_unsupported_architecture_is_named(tmp_path, tiny_model_dir):
    d = copy_dir(tiny_model_dir("llama"), tmp_path / "gpt2")
    cfg = json.loads((d / "config.json").read_text())
    cfg["architectures"] = ["GPT2LMHeadModel"]
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelLoadError, match=r"config.json.*unsupported architecture 'GPT2LMHeadModel'"):
        load_model(d, progress=False)


def test_shape_mismatch_names_file_and_tensor(tmp_path, tiny_model_dir):
    d = copy_dir(tiny_model_dir("llama"), tmp_path / "bad_shape")
    weights = load_file(d / "model.safetensors")
    weights["model.layers.1.self_attn.k_proj.weight"] = torch.zeros(7, 128)
    save_file(weights, d / "model.safetensors")
    with pytest.raises(ModelLoadError, match=r"model.safetensors: tensor 'model.layers.1.self_attn.k_proj.weight' has shape \(7, 128\)"):
        load_model(d, progress=False)


def test_missing_and_unexpected_tensors_are_named(tmp_path, tiny_model_dir):
    d = copy_dir(tiny_model_dir("llama"), tmp_path / "missing")
    weights = load_file(d / "model.safetensors")
    del weights["model.layers.0.mlp.up_proj.weight"]
    save_file(weights, d / "model.safetensors")
    with pytest.raises(ModelLoadError, match=r"missing tensor\(s\) \['model.layers.0.mlp.up_proj.weight'\]"):
        load_model(d, progress=False)
    weights["model.layers.0.mlp.up_proj.weight"] = torch.zeros(256, 128)
    weights["model.layers.0.mlp.extra.weight"] = torch.zeros(2)
    save_file(weights, d / "model.safetensors")
    with pytest.raises(ModelLoadError, match=r"unexpected tensor 'model.layers.0.mlp.extra.weight'"):
        load_model(d, progress=False)


def test_bad_config_json_is_named(tmp_path, tiny_model_dir):
    d = copy_dir(tiny_model_dir("llama"), tmp_path / "badjson")
    (d / "config.json").write_text("{not json")
    with pytest.raises(ModelLoadError, match="config.json: not valid JSON"):
        load_model(d, progress=False)
    cfg = {"architectures": ["LlamaForCausalLM"], "hidden_size": 8}
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelLoadError, match="required field 'num_hidden_layers' is missing"):
        load_model(d, progress=False)


def test_loaded_weights_equal_the_checkpoint(tiny_model_dir):
    d = tiny_model_dir("qwen2")
    model = load_model(d, progress=False)
    weights = load_file(d / "model.safetensors")
    qkv = model.layers[1].self_attn.qkv_proj
    q, k, v = (weights[f"model.layers.1.self_attn.{n}_proj.bias"] for n in "qkv")
    assert torch.equal(qkv.bias, torch.cat([q, k, v]))
    gate_up = model.layers[0].mlp.gate_up_proj.weight
    assert torch.equal(gate_up[256:], weights["model.layers.0.mlp.up_proj.weight"])
