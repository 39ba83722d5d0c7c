"""Executor: does what the scheduler decided. One `ScheduleOutput` in, one `ModelOutput` out:
lay the rows out as a forward batch (`ScheduledBatch`), run the model, sample (`Sampling`).

A forward that raises an `Exception` comes back as a `ModelOutput` with `error` set (the
scheduler then rolls the batch back and ends its requests with that error; the other requests
keep running); anything else (KeyboardInterrupt) propagates.
"""

from __future__ import annotations

import logging
import time

from radixkv.core.batch import ScheduledBatch
from radixkv.core.sampling import Sampling
from radixkv.model.runner import ModelRunner
from radixkv.sched.records import ModelOutput, ScheduleOutput

logger = logging.getLogger(__name__)


class Executor:
    """Runs scheduled batches on one `ModelRunner` and samples their next tokens."""

    def __init__(self, runner: ModelRunner, sampling: Sampling):
        self.runner = runner
        self.sampling = sampling

    def execute(self, out: ScheduleOutput) -> ModelOutput:
        batch = ScheduledBatch.build(out, self.runner.device)
        start = time.perf_counter()
        try:
            if self.runner.lora is not None:
                self.runner.prepare_lora([(len(row.tokens), row.req.lora) for row in out.rows])
            logits = self.runner.forward(batch.forward)  # (N, V): the rows batch.layout names
        except Exception as e:
            logger.exception("model forward failed; ending the %d request(s) of its batch", len(batch.rows))
            return ModelOutput(forward_start=start, error=f"the model forward failed: {type(e).__name__}: {e}")
        seconds = time.perf_counter() - start
        samples, prompts = self.sampling.process(batch, logits)
        return ModelOutput(samples, prompts, forward_seconds=seconds, forward_start=start)
