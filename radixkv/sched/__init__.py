"""Scheduling: requests, policies, admission, the requests' KV memory and the scheduler that
decides each step of continuous batching (the engine core, `radixkv.core`, runs them)."""

from radixkv.outputs import ReqOutput
from radixkv.sched.stats import SchedulerStats
from radixkv.sched.request import Req, ReqStatus
from radixkv.sched.scheduler import Scheduler

__all__ = ["Req", "ReqOutput", "ReqStatus", "Scheduler", "SchedulerStats"]
