"""A real Mooncake master (`mooncake_master`, from the `mooncake` extra) on free loopback ports,
for the tests of the shared store. Skips where the extra is not installed (`.ci/run` installs it)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def master_binary() -> str:
    pytest.importorskip("mooncake.store", reason="pip install 'radixkv[mooncake]' (and Debian's libibverbs1)")
    path = Path(sys.executable).parent / "mooncake_master"
    found = str(path) if path.exists() else shutil.which("mooncake_master")
    if found is None:
        pytest.skip("mooncake_master not found beside the interpreter or on PATH")
    return found


@dataclass
class Master:
    """One `mooncake_master` process; `stop` and `start` again keep its ports (a restart)."""

    rpc_port: int
    metrics_port: int
    log: Path
    proc: subprocess.Popen | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.rpc_port}"

    def config(self, **extra) -> str:
        """`--kv-storage-config` for a server using this master (small buffers for tests)."""
        import json
        return json.dumps({"master_server_address": self.address, "global_segment_size": "256MiB",
                           "local_buffer_size": "64MiB", **extra})

    def start(self) -> Master:
        cmd = [master_binary(), f"--rpc_port={self.rpc_port}", "--rpc_address=127.0.0.1",
               f"--metrics_port={self.metrics_port}", "--default_kv_lease_ttl=1000"]
        self.proc = subprocess.Popen(cmd, stdout=open(self.log, "ab"), stderr=subprocess.STDOUT,
                                     env={**os.environ, "GLOG_minloglevel": "1"})
        deadline = time.monotonic() + 20
        while True:  # ready once its RPC port takes connections
            try:
                socket.create_connection(("127.0.0.1", self.rpc_port), timeout=0.2).close()
                return self
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"mooncake_master did not start:\n{self.log.read_text()[-2000:]}") from None
                time.sleep(0.05)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


def start_master(tmp_path: Path) -> Master:
    return Master(_free_port(), _free_port(), tmp_path / "mooncake_master.log").start()
