"""Which device a tensor-parallel rank computes on."""

from __future__ import annotations

import torch

from radixkv.config import EngineConfig


def rank_device(config: EngineConfig, rank: int) -> torch.device:
    """The device of tensor-parallel rank `rank`: the config's, or `cuda:<its rank on its node>`
    with several GPUs."""
    device = config.runtime.torch_device
    if device.type == "cuda" and config.runtime.tp_size > 1:
        return torch.device("cuda", rank % config.runtime.ranks_per_node)
    return device


def use_rank_device(device: torch.device) -> None:
    """Make `device` this process's current CUDA device: Triton kernels and NCCL launch on the
    current device, whatever device their tensors are on."""
    if device.type == "cuda":
        torch.cuda.set_device(device)
