"""Servers the benchmarks talk to over HTTP: radixkv's own, and vLLM's (from its own venv).

Each runs as a subprocess, alone on the machine while it is measured; `start_*` returns once it
answers, or None with the reason it cannot run (the benchmark then goes on without it).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx

PEERS = Path(__file__).resolve().parent / "peers"
VLLM_PYTHON = PEERS / ".venv-vllm" / "bin" / "python"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """A server subprocess and its OpenAI-compatible base URL."""

    def __init__(self, name: str, cmd: list[str], port: int, env: dict | None = None, model: str = ""):
        self.name, self.port, self.model = name, port, model
        self.url = f"http://127.0.0.1:{port}"
        self.log: list[str] = []
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                     env={**os.environ, **(env or {})}, start_new_session=True)
        threading.Thread(target=lambda: [self.log.append(line) for line in self.proc.stdout], daemon=True).start()

    def wait_ready(self, path: str, timeout: float) -> str | None:
        """None once `path` answers 200, else why not."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                return f"{self.name} exited with {self.proc.returncode}: {''.join(self.log[-15:])}"
            try:
                if httpx.get(self.url + path, timeout=2).status_code == 200:
                    return None
            except httpx.TransportError:
                pass
            time.sleep(0.5)
        return f"{self.name} did not answer within {timeout:.0f} s"

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()


def start_radixkv(*args: str, timeout: float = 300) -> Server:
    port = free_port()
    server = Server("radixkv", [sys.executable, "-m", "radixkv", "serve", "--port", str(port), "--log-level",
                                "warning", "--served-model-name", "model", *args], port, model="model")
    reason = server.wait_ready("/health", timeout)
    if reason:
        server.stop()
        raise RuntimeError(reason)
    return server


def start_vllm(model_dir: str, block_size: int, max_model_len: int = 4096, timeout: float = 600,
               extra: tuple[str, ...] = ()) -> tuple[Server | None, str | None]:
    """vLLM's OpenAI server at its best here: both cores, prefix caching, `block_size` tokens per
    block, fp32 like radixkv, `extra` flags after those. (None, reason) when the peer is not
    installed or fails."""
    if not VLLM_PYTHON.exists():
        return None, f"vLLM is not installed: run `bash {PEERS / 'setup.sh'}`"
    port = free_port()
    cmd = [str(VLLM_PYTHON), "-m", "vllm.entrypoints.openai.api_server", "--model", model_dir,
           "--served-model-name", "model", "--dtype", "float32", "--block-size", str(block_size),
           "--enable-prefix-caching", "--max-model-len", str(max_model_len), "--port", str(port),
           "--host", "127.0.0.1", "--enable-prompt-tokens-details", *extra]
    env = {"VLLM_CPU_KVCACHE_SPACE": "2", "VLLM_CPU_NUM_OF_RESERVED_CPU": "0", "VLLM_TARGET_DEVICE": "cpu"}
    server = Server(f"vllm(block {block_size})", cmd, port, env, model="model")
    reason = server.wait_ready("/v1/models", timeout)
    if reason:
        server.stop()
        return None, reason
    return server, None


def start_engine(engine: str, model_dir: str, *radixkv_flags: str) -> tuple[Server | None, str | None]:
    """The server for a benchmark's engine name: `vllm-bN` (vLLM at block size N) or a radixkv
    variant started with `radixkv_flags` (a `...-no-cache` name adds --disable-radix-cache).
    (server, None), or (None, why a peer could not start)."""
    if engine.startswith("vllm"):
        return start_vllm(model_dir, block_size=int(engine.split("-b")[1]))
    no_cache = ["--disable-radix-cache"] if engine.endswith("no-cache") else []
    return start_radixkv(*radixkv_flags, *no_cache), None
