"""The engine core: the composition root of one engine and its loop (schedule -> execute ->
update -> emit), above the scheduler that only decides (`radixkv.sched`)."""

from radixkv.core.engine_core import EngineCore

__all__ = ["EngineCore"]
