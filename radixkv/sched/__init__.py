"""Scheduling: requests, batches, policies and the continuous-batching loop."""

from radixkv.outputs import ReqOutput
from radixkv.sched.stats import SchedulerStats
from radixkv.sched.request import Req, ReqStatus
from radixkv.sched.scheduler import Scheduler

__all__ = ["Req", "ReqOutput", "ReqStatus", "Scheduler", "SchedulerStats"]
