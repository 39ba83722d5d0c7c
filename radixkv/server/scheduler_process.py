"""The scheduler process: model runner + scheduler, the same `SchedulerLoop` the Engine runs,
fed from a ZMQ socket instead of a queue.

    PULL  <- tokenizer manager: GenerateRequest, AbortMsg, ControlRequest
    PUSH  -> detokenizer:       TokenBatch (every step's outputs)
    PUSH  -> tokenizer manager: SchedulerReady / SchedulerFailed once, ControlReply per control
"""

from __future__ import annotations

import sys
import time
from typing import Any

import zmq

from radixkv.config import EngineConfig
from radixkv.errors import RadixKVError
from radixkv.ipc import (
    AbortMsg,
    ControlReply,
    ControlRequest,
    GenerateRequest,
    ProtocolError,
    SchedulerFailed,
    SchedulerReady,
    TokenBatch,
    decode,
    encode,
)
from radixkv.procs import PARENT_POLL_MS, become_child, parent_alive
from radixkv.server.sockets import Endpoints


def token_batch(outputs, params_by_rid: dict) -> TokenBatch:
    """The step's outputs as one message for the detokenizer (which needs each request's stop
    strings and special-token choice; a finished request's entry is dropped)."""
    params = [params_by_rid.pop(o.rid, None) if o.finished else params_by_rid.get(o.rid) for o in outputs]
    return TokenBatch(
        rids=[o.rid for o in outputs], new_ids=[o.new_ids for o in outputs],
        finished=[o.finished for o in outputs], finish_reasons=[o.finish_reason for o in outputs],
        prompt_tokens=[o.prompt_tokens for o in outputs], cached_tokens=[o.cached_tokens for o in outputs],
        completion_tokens=[o.completion_tokens for o in outputs], ttft=[o.ttft for o in outputs],
        latency=[o.latency for o in outputs], errors=[o.error for o in outputs],
        error_codes=[o.error_code for o in outputs],
        stops=[list(p.stop) if p else [] for p in params],
        skip_special_tokens=[p.skip_special_tokens if p else True for p in params],
        output_logprobs=[o.output_logprobs for o in outputs],
        output_top_logprobs=[o.output_top_logprobs for o in outputs],
        input_logprobs=[o.input_logprobs for o in outputs],
        input_top_logprobs=[o.input_top_logprobs for o in outputs],
    )


def scheduler_info(scheduler, config: EngineConfig) -> dict[str, Any]:
    """What the HTTP process needs to know: limits for validation, the pool, the config."""
    from dataclasses import asdict

    mc = scheduler.runner.model_config
    return {"limits": scheduler.limits.to_dict(), "model_dir": str(scheduler.runner.model_dir),
            "architecture": mc.architecture, "page_size": scheduler.page_size,
            "max_total_tokens": scheduler.allocator.total_tokens,
            "kv_bytes_per_token": scheduler.memory.layout.bytes_per_token,
            "num_threads": scheduler.runner.num_threads, "device": str(scheduler.runner.device),
            "dtype": str(scheduler.runner.dtype).replace("torch.", ""),
            "attention_backend": scheduler.runner.backend.name, "config": asdict(config)}


class ZmqInbox:
    """The scheduler loop's inbox in the server: decodes messages into loop commands."""

    def __init__(self, socket: zmq.Socket, reply: zmq.Socket, parent_pid: int, reject, logger,
                 healthy=lambda: True):
        self.socket, self.reply, self.parent_pid = socket, reply, parent_pid
        self.healthy = healthy  # False once the runner cannot compute (a tensor-parallel rank is lost)
        self.params_by_rid: dict = {}  # rid -> SamplingParams of requests in flight
        self.reject = reject  # reject(rid, message): an error output for a request that never ran
        self.logger = logger

    def receive(self, block: bool) -> list:
        from radixkv.sched.loop import Stop

        commands = []
        if not self.healthy():
            return [Stop()]  # in-flight requests end with an error; the server sees this process exit
        while block and not self.socket.poll(PARENT_POLL_MS):
            if not parent_alive(self.parent_pid) or not self.healthy():
                return [Stop()]
        while True:
            try:
                data = self.socket.recv(zmq.NOBLOCK)
            except zmq.Again:
                return commands
            try:
                command = self._command(decode(data))
            except ProtocolError as e:
                self.logger.error("dropping a message: %s", e)
                continue
            if command is not None:
                commands.append(command)

    def _command(self, msg):
        from radixkv.sampling_params import SamplingParams
        from radixkv.sched import Req
        from radixkv.sampling_params import LogprobParams
        from radixkv.sched.loop import AbortRequest, AddRequest, CallScheduler, Stop

        if isinstance(msg, GenerateRequest):
            try:
                req = Req(msg.rid, list(msg.input_ids), SamplingParams.from_dict(msg.sampling_params),
                          namespace=msg.namespace, logprob=LogprobParams(*msg.logprob))
            except (RadixKVError, TypeError) as e:
                self.reject(msg.rid, str(e))
                return None
            self.params_by_rid[msg.rid] = req.params
            return AddRequest(req)
        if isinstance(msg, AbortMsg):
            return AbortRequest(msg.rid)
        if isinstance(msg, ControlRequest):
            if msg.kind == "shutdown":
                return Stop()
            fn = {"flush_cache": lambda s: {"flushed": s.flush_cache()},
                  "stats": lambda s: s.get_stats()}.get(msg.kind)
            if fn is None:
                self.reply.send(encode(ControlReply(msg.call_id, False, {"error": f"unknown control {msg.kind!r}"})))
                return None
            command = CallScheduler(fn)
            command.future.add_done_callback(lambda f, cid=msg.call_id: self._answer(cid, f))
            return command
        self.logger.error("unexpected %s on the scheduler's socket", type(msg).__name__)
        return None

    def _answer(self, call_id: str, future) -> None:
        error = future.exception()
        reply = ControlReply(call_id, False, {"error": str(error)}) if error else ControlReply(call_id, True, future.result())
        self.reply.send(encode(reply))


def run_scheduler_process(config: EngineConfig, endpoints: Endpoints, parent_pid: int) -> None:
    """Entry point of the scheduler process (started by `radixkv.server.launch`)."""
    logger = become_child(parent_pid, config.log_level, "scheduler")
    ctx = zmq.Context(1)
    inbox_socket = ctx.socket(zmq.PULL)
    inbox_socket.bind(endpoints.scheduler)
    to_detokenizer = ctx.socket(zmq.PUSH)
    to_detokenizer.connect(endpoints.detokenizer)
    to_tokenizer = ctx.socket(zmq.PUSH)
    to_tokenizer.connect(endpoints.tokenizer)
    try:
        from radixkv.sched import Scheduler
        from radixkv.sched.loop import SchedulerLoop, error_output

        start = time.perf_counter()
        scheduler = Scheduler.load(config, progress=True)
        logger.info("scheduler ready in %.1f s", time.perf_counter() - start)
    except RadixKVError as e:
        to_tokenizer.send(encode(SchedulerFailed(str(e))))
        to_tokenizer.close(linger=2000)
        sys.exit(2)
    except Exception as e:
        logger.exception("the scheduler could not start")
        to_tokenizer.send(encode(SchedulerFailed(f"{type(e).__name__}: {e}")))
        to_tokenizer.close(linger=2000)
        sys.exit(1)
    to_tokenizer.send(encode(SchedulerReady(scheduler_info(scheduler, config))))

    def deliver(outputs) -> None:
        if outputs:
            to_detokenizer.send(encode(token_batch(outputs, inbox.params_by_rid)))

    inbox = ZmqInbox(inbox_socket, to_tokenizer, parent_pid,
                     lambda rid, message: deliver([error_output(rid, message, 400)]), logger,
                     healthy=lambda: scheduler.runner.healthy)
    loop = SchedulerLoop(scheduler, deliver)
    try:
        loop.run(inbox)
        if not scheduler.runner.healthy:
            logger.error("stopping: %s", scheduler.runner.workers.failed)
            sys.exit(1)
    finally:
        scheduler.runner.close()  # the other tensor-parallel ranks, if any
        for sock in (inbox_socket, to_detokenizer, to_tokenizer):
            sock.close(linger=500)
        ctx.term()
