"""The collectives a tensor-parallel model needs, over torch.distributed process groups.

Two process groups span the ranks, both made from one `TCPStore` that rank 0 hosts:
- `compute`: the all-reduces and all-gathers inside a forward (NCCL on CUDA, gloo on CPU),
  with a timeout so a rank that hangs mid-forward surfaces as an error;
- `control`: gloo, carrying rank 0's messages to the others (`broadcast_bytes`). Its set-up and
  rank 0's sends are bounded; only a waiting rank's receive is not (it waits while the server
  is idle). A rank 0 that dies takes its ranks with it (see `radixkv.tp.worker`).

gloo binds to 127.0.0.1 when the ranks are processes of one machine; across machines
(`--nnodes`), to the address this machine reaches node 0's rendezvous by (`gloo_host`).

The groups are backend objects of this runtime, not torch's global default group, so an
`Engine(tp_size=2)` inside a user's process leaves that process's `torch.distributed` alone.
`SingleRank` is the same interface for one rank: the model code has no "if parallel" branches.
"""

from __future__ import annotations

import ipaddress
import socket
import time
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

COMPUTE_TIMEOUT = timedelta(seconds=300)  # a collective inside a forward; also joining a group
SEND_TIMEOUT = timedelta(seconds=60)  # rank 0's broadcast: the others are already waiting for it
IDLE_FOREVER = timedelta(days=365)  # a rank waiting for rank 0's next message


def gloo_host(dist_init_addr: str | None) -> str:
    """The address this machine's ranks take gloo connections on: loopback within one machine
    (or when node 0 is this machine), else the local address of the route to node 0."""
    if not dist_init_addr:
        return "127.0.0.1"
    host, _, port = dist_init_addr.rpartition(":")
    ip = socket.gethostbyname(host)
    if ipaddress.ip_address(ip).is_loopback:
        return "127.0.0.1"
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:  # (no packet is sent: only a route is chosen)
        s.connect((ip, int(port)))
        return s.getsockname()[0]


def _gloo(store: dist.Store, rank: int, size: int, hostname: str) -> dist.ProcessGroupGloo:
    options = dist.ProcessGroupGloo._Options()
    options._devices = [dist.ProcessGroupGloo.create_device(hostname=hostname)]
    options._timeout = COMPUTE_TIMEOUT
    return dist.ProcessGroupGloo(store, rank, size, options)


@dataclass(slots=True)
class CommStats:
    """Forwards on this rank and the time inside their collectives (wall seconds, host side: on
    CUDA a collective's time is that of its launch unless the stream is synchronised)."""

    forwards: int = 0
    forward_seconds: float = 0.0
    all_reduces: int = 0
    all_reduce_seconds: float = 0.0
    all_gathers: int = 0
    all_gather_seconds: float = 0.0

    def to_dict(self) -> dict[str, float]:
        n = max(self.forwards, 1)
        comm = self.all_reduce_seconds + self.all_gather_seconds
        return {"tp_forwards": self.forwards, "tp_all_reduces": self.all_reduces,
                "tp_all_reduce_seconds": self.all_reduce_seconds, "tp_all_gathers": self.all_gathers,
                "tp_all_gather_seconds": self.all_gather_seconds,
                "tp_all_reduce_ms_per_forward": 1e3 * self.all_reduce_seconds / n,
                "tp_comm_share_of_forward": comm / self.forward_seconds if self.forward_seconds else 0.0}


class SingleRank:
    """The whole model on one rank: every collective is the identity."""

    rank, size = 0, 1

    def __init__(self) -> None:
        self.stats = CommStats()

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        return x

    def all_gather(self, x: torch.Tensor) -> torch.Tensor:
        return x


class TPGroup:
    """Rank `rank` of a `size`-rank tensor-parallel group (see the module docstring)."""

    def __init__(self, store: dist.Store, rank: int, size: int, device: torch.device, hostname: str = "127.0.0.1"):
        self.rank, self.size, self.device = rank, size, device
        self.stats = CommStats()
        compute_store = dist.PrefixStore("compute", store)
        if device.type == "cuda":
            options = dist.ProcessGroupNCCL.Options()
            options._timeout = COMPUTE_TIMEOUT
            self.compute = dist.ProcessGroupNCCL(compute_store, rank, size, options)
        else:
            self.compute = _gloo(compute_store, rank, size, hostname)
        self.control = _gloo(dist.PrefixStore("control", store), rank, size, hostname)

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum `x` over the ranks, in place; returns `x`."""
        start = time.perf_counter()
        self.compute.allreduce([x]).wait()
        self.stats.all_reduces += 1
        self.stats.all_reduce_seconds += time.perf_counter() - start
        return x

    def all_gather(self, x: torch.Tensor) -> torch.Tensor:  # (N, W) -> (N, size * W)
        """Every rank's `x`, concatenated along the last dimension in rank order."""
        start = time.perf_counter()
        parts = [torch.empty_like(x) for _ in range(self.size)]
        self.compute.allgather([parts], [x.contiguous()]).wait()
        self.stats.all_gathers += 1
        self.stats.all_gather_seconds += time.perf_counter() - start
        return torch.cat(parts, dim=-1)

    def broadcast_bytes(self, data: bytes | None = None, timeout: timedelta = SEND_TIMEOUT) -> bytes:
        """Rank 0 sends `data` (within `timeout`); every rank returns it (the others pass None
        and wait for it as long as it takes)."""
        size = torch.tensor([len(data) if self.rank == 0 else 0], dtype=torch.int64)
        self.control.broadcast(size, 0, timeout if self.rank == 0 else IDLE_FOREVER).wait()
        if self.rank == 0:
            payload = torch.frombuffer(bytearray(data), dtype=torch.uint8)
        else:
            payload = torch.empty(int(size.item()), dtype=torch.uint8)
        self.control.broadcast(payload, 0, timeout).wait()
        return payload.numpy().tobytes()
