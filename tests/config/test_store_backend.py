"""`--kv-storage-backend` / `--kv-storage-config`: checked at start-up, each error naming the key."""

import json

import pytest

from radixkv.config import EngineConfig, StorageConfig
from radixkv.config import store_backend
from radixkv.config.store_backend import MooncakeSettings, parse_mooncake
from radixkv.errors import ConfigError


def test_defaults_and_sizes():
    s = parse_mooncake('{"master_server_address": "10.0.0.5:50051", "global_segment_size": "2GiB"}')
    assert s == MooncakeSettings("10.0.0.5:50051", global_segment_size=2 << 30)
    assert s.as_setup()["metadata_server"] == "P2PHANDSHAKE" and s.as_setup()["protocol"] == "tcp"


@pytest.mark.parametrize("text, names", [
    (None, "master_server_address"),
    ("not json", "not JSON"),
    ("[1]", "JSON object"),
    ('{"master_server_address": "h:1", "master": "x"}', "kv_storage_config.master"),
    ('{"metadata_server": "P2PHANDSHAKE"}', "kv_storage_config.master_server_address"),
    ('{"master_server_address": "nohostport"}', "kv_storage_config.master_server_address"),
    ('{"master_server_address": "h:99999"}', "kv_storage_config.master_server_address"),
    ('{"master_server_address": "h:1", "protocol": "udp"}', "kv_storage_config.protocol"),
    ('{"master_server_address": "h:1", "global_segment_size": "lots"}', "kv_storage_config.global_segment_size"),
    ('{"master_server_address": "h:1", "local_buffer_size": 1024}', "kv_storage_config.local_buffer_size"),
    ('{"master_server_address": "h:1", "global_segment_size": true}', "kv_storage_config.global_segment_size"),
    ('{"master_server_address": "h:1", "local_hostname": ""}', "kv_storage_config.local_hostname"),
])
def test_bad_settings_name_the_key(text, names):
    with pytest.raises(ConfigError, match=names.replace(".", r"\.")):
        parse_mooncake(text)


def test_the_backends_flags_are_checked_against_each_other():
    good = json.dumps({"master_server_address": "127.0.0.1:50051"})
    with pytest.raises(ConfigError, match="kv_storage_config"):
        StorageConfig(kv_storage_dir="/tmp/x", kv_storage_config=good)  # file backend: no config
    with pytest.raises(ConfigError, match="kv_storage_dir"):
        StorageConfig(kv_storage_dir="/tmp/x", kv_storage_backend="mooncake", kv_storage_config=good)
    with pytest.raises(ConfigError, match="kv_storage_backend"):
        StorageConfig(kv_storage_backend="redis")
    with pytest.raises(ConfigError, match="host-kv-size"):
        EngineConfig.from_kwargs(kv_storage_backend="mooncake", kv_storage_config=good)


def test_write_policy_defaults_by_backend():
    assert StorageConfig(kv_storage_dir="/tmp/x").write_policy == "write-back"
    assert StorageConfig(kv_storage_dir="/tmp/x", kv_storage_write_policy="write-through").write_policy == "write-through"
    assert not StorageConfig().enabled


def test_a_missing_package_names_what_to_install(monkeypatch):
    monkeypatch.setattr(store_backend.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ConfigError, match=r"pip install 'radixkv\[mooncake\]'"):
        StorageConfig(kv_storage_backend="mooncake", kv_storage_config='{"master_server_address": "h:1"}')
