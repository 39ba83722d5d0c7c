"""`load_runner`: the model runner a configuration asks for, with its tensor-parallel ranks."""

from __future__ import annotations

from radixkv.config import EngineConfig
from radixkv.model.runner import ModelRunner
from radixkv.tp.ranks import TPWorkers


def load_runner(config: EngineConfig, progress: bool = True) -> ModelRunner:
    """`ModelRunner.load(config)`; with `tp_size` N > 1 this process is rank 0 and ranks 1..N-1
    are started as processes of their own (`radixkv.tp.worker`)."""
    if config.runtime.tp_size == 1:
        return ModelRunner.load(config, progress)
    return ModelRunner.load(config, progress, launch_peers=lambda model_dir: TPWorkers.launch(config, model_dir))
