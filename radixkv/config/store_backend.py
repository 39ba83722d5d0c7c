"""The storage tier's backends and their settings: `file` (a local directory) and `mooncake` (a
Mooncake Store every replica shares), with `--kv-storage-config` parsed and checked here, at
start-up, so a typo is an error naming the key rather than a store that never connects.

`MooncakeSettings` takes the keys SGLang's `--hicache-storage-backend-extra-config` takes for
Mooncake (`master_server_address`, `metadata_server`, `protocol`, `device_name`,
`global_segment_size`, `local_buffer_size`, `local_hostname`); sizes are bytes or "4GiB"-style.
"""

from __future__ import annotations

import importlib.util
import json
from dataclasses import dataclass, fields
from typing import Any

from radixkv.errors import ConfigError
from radixkv.kv_bytes import parse_size

STORAGE_BACKENDS = ("file", "mooncake")
MOONCAKE_PACKAGE = "mooncake-transfer-engine-non-cuda"  # (the CUDA build, mooncake-transfer-engine, is the same API)
INSTALL_HINT = "pip install 'radixkv[mooncake]' (and Debian's libibverbs1, which its wheels link)"


@dataclass(frozen=True)
class MooncakeSettings:
    """Where the Mooncake master is and what this replica gives the store. `global_segment_size`:
    the host memory this replica mounts into the shared store (the store's capacity is the sum of
    every replica's; the master evicts); `local_buffer_size`: the buffer its transfers go through.
    `metadata_server`: `P2PHANDSHAKE` (no metadata server: peers exchange it themselves), an
    `http://host:port/metadata` address (the master's `--enable_http_metadata_server`), or etcd."""

    master_server_address: str
    metadata_server: str = "P2PHANDSHAKE"
    protocol: str = "tcp"
    device_name: str = ""
    global_segment_size: int = 1 << 30
    local_buffer_size: int = 256 << 20
    local_hostname: str = "127.0.0.1"

    def as_setup(self) -> dict[str, Any]:
        """The dict `MooncakeDistributedStore.setup` takes."""
        return {"local_hostname": self.local_hostname, "metadata_server": self.metadata_server,
                "global_segment_size": self.global_segment_size, "local_buffer_size": self.local_buffer_size,
                "protocol": self.protocol, "rdma_devices": self.device_name,
                "master_server_addr": self.master_server_address}


def _host_port(value: Any, key: str) -> str:
    host, sep, port = str(value).rpartition(":")
    if not isinstance(value, str) or not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"kv_storage_config.{key}={value!r}: must be HOST:PORT")
    return value


def parse_mooncake(text: str | None) -> MooncakeSettings:
    """`--kv-storage-config` for the mooncake backend: a JSON object (see `MooncakeSettings`)."""
    if text is None:
        raise ConfigError("kv_storage_backend='mooncake': needs --kv-storage-config "
                          "'{\"master_server_address\": \"HOST:PORT\"}' (the Mooncake master)")
    try:
        raw = json.loads(text)
    except ValueError as e:
        raise ConfigError(f"kv_storage_config: not JSON ({e})") from None
    if not isinstance(raw, dict):
        raise ConfigError("kv_storage_config: must be a JSON object")
    known = {f.name for f in fields(MooncakeSettings)}
    unknown = sorted(set(raw) - known)
    if unknown:
        raise ConfigError(f"kv_storage_config.{unknown[0]}: unknown key for the mooncake backend; "
                          f"known keys: {sorted(known)}")
    if "master_server_address" not in raw:
        raise ConfigError("kv_storage_config.master_server_address: required (HOST:PORT of the Mooncake master)")
    out: dict[str, Any] = {"master_server_address": _host_port(raw["master_server_address"], "master_server_address")}
    for key in ("metadata_server", "protocol", "device_name", "local_hostname"):
        if key in raw:
            if not isinstance(raw[key], str) or (key != "device_name" and not raw[key].strip()):
                raise ConfigError(f"kv_storage_config.{key}={raw[key]!r}: must be a non-empty string")
            out[key] = raw[key]
    if out.get("protocol", "tcp") not in ("tcp", "rdma"):
        raise ConfigError(f"kv_storage_config.protocol={out['protocol']!r}: must be tcp or rdma")
    for key, least in (("global_segment_size", 16 << 20), ("local_buffer_size", 16 << 20)):
        if key in raw:
            value = raw[key]
            try:
                size = parse_size(value) if isinstance(value, str) else value
            except ConfigError as e:
                raise ConfigError(f"kv_storage_config.{key}={value!r}: {e}") from None
            if not isinstance(size, int) or isinstance(size, bool) or size < least:
                raise ConfigError(f"kv_storage_config.{key}={value!r}: must be a size of at least {least >> 20} MiB")
            out[key] = size
    return MooncakeSettings(**out)


def require_mooncake() -> None:
    """A ConfigError naming the package to install when Mooncake's Python package is absent."""
    if importlib.util.find_spec("mooncake") is None:
        raise ConfigError(f"kv_storage_backend='mooncake': the Mooncake package ({MOONCAKE_PACKAGE}) is not "
                          f"installed: {INSTALL_HINT}")
