"""Which slice each tensor-parallel rank holds, and the refusal of a tp_size that cannot split."""

import pytest

from radixkv.cli import build_parser
from radixkv.config import EngineConfig
from radixkv.errors import ConfigError
from radixkv.model.config import ModelConfig, RopeConfig
from radixkv.model.config import check_tp_size
from radixkv.parallel.shard import TPShard


def model_config(heads=8, kv_heads=4, inter=256, vocab=509):
    return ModelConfig("LlamaForCausalLM", vocab, 128, inter, 2, heads, kv_heads, 16, 1e-5, RopeConfig(), 512,
                       sliding_windows=(None, None))


def test_parts_tile_the_dimension_in_rank_order():
    parts = [TPShard(r, 4).part(32) for r in range(4)]
    assert [(p.start, p.stop) for p in parts] == [(0, 8), (8, 16), (16, 24), (24, 32)]
    assert TPShard().part(32) == slice(0, 32)


def test_vocab_rows_cover_the_vocabulary_once_and_pad_the_last_rank():
    rows = [TPShard(r, 2).vocab_rows(509) for r in range(2)]
    assert rows == [(0, 255, 255), (255, 509, 255)]  # rank 1 holds 254 real rows + 1 zero row
    rows = [TPShard(r, 3).vocab_rows(4) for r in range(3)]
    assert rows == [(0, 2, 2), (2, 4, 2), (4, 4, 2)]  # a rank may hold padding only


def test_a_rank_outside_the_group_is_refused():
    with pytest.raises(ValueError, match="rank 2 is not in"):
        TPShard(2, 2)


def test_tp_size_that_splits_heads_kv_heads_and_mlp_is_accepted():
    check_tp_size(model_config(), 2)
    check_tp_size(model_config(), 4)


@pytest.mark.parametrize(("config", "named"), [
    (model_config(kv_heads=1), "num_key_value_heads=1"),  # MQA: one KV head cannot split
    (model_config(heads=9, kv_heads=3), "num_attention_heads=9"),
    (model_config(inter=255), "intermediate_size=255"),
])
def test_tp_size_that_does_not_divide_is_refused_naming_the_field(config, named):
    with pytest.raises(ConfigError, match=named) as e:
        check_tp_size(config, 2, "m/config.json")
    assert "tp_size=2" in str(e.value) and "m/config.json" in str(e.value)


def test_engine_config_validates_tp_size():
    with pytest.raises(ConfigError, match="tp_size=0"):
        EngineConfig.from_kwargs(tp_size=0)
    assert EngineConfig.from_kwargs(tp_size=2).runtime.tp_size == 2


def test_tp_flag_and_its_long_form_set_tp_size():
    parser = build_parser()
    assert parser.parse_args(["serve", "--tp", "2"]).tp_size == 2
    assert parser.parse_args(["generate", "hi", "--tp-size", "4"]).tp_size == 4
    assert parser.parse_args(["serve"]).tp_size == 1
