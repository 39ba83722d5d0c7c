"""The scheduler process: an `EngineCore`, driven by the same `SchedulerLoop` the Engine runs,
fed from a ZMQ socket instead of a queue.

    PULL  <- tokenizer manager: GenerateRequest, AbortMsg, ControlRequest
    PUSH  -> detokenizer:       DetokenizeParams (once per request), TokenBatch (every step's outputs)
    PUSH  -> tokenizer manager: SchedulerReady / SchedulerFailed once, ControlReply per control
"""

from __future__ import annotations

import logging
import sys
import time
from typing import Any

import zmq

from radixkv.config import EngineConfig
from radixkv.core import EngineCore
from radixkv.core.loop import AbortRequest, AddRequest, CallCore, Command, SchedulerLoop, Stop
from radixkv.errors import ErrorKind, InvalidRequestError, LoRAInUse, RadixKVError
from radixkv.ipc import (
    AbortMsg,
    ControlReply,
    ControlRequest,
    DetokenizeParams,
    GenerateRequest,
    ProtocolError,
    SchedulerFailed,
    SchedulerReady,
    TokenBatch,
    decode,
    encode,
)
from radixkv.mem.tree_view import MAX_NODES, tree_nodes
from radixkv.outputs import ReqOutput
from radixkv.procs import PARENT_POLL_MS, become_child, parent_alive
from radixkv.sched import Req
from radixkv.server.runtime.sockets import Endpoints

CONTROLS = {"flush_cache": lambda s, viewer, args: {"flushed": s.flush_cache()},
            "stats": lambda s, viewer, args: s.get_stats(),
            "cache_tree": lambda s, viewer, args: tree_nodes(s.cache, MAX_NODES, viewer),
            "load_lora": lambda s, viewer, args: {"adapters": s.load_lora(args.get("lora_name"), args.get("lora_path"))},
            "unload_lora": lambda s, viewer, args: {"adapters": s.unload_lora(args.get("lora_name"))},
            "lora_adapters": lambda s, viewer, args: {"adapters": s.lora_adapters()}}


def error_kind(error: BaseException) -> str:
    """How the HTTP process reports a control call's failure: conflict (409), invalid (400), internal."""
    if isinstance(error, LoRAInUse):
        return "conflict"
    return "invalid" if isinstance(error, InvalidRequestError) else "internal"


def scheduler_info(scheduler: EngineCore, config: EngineConfig) -> dict[str, Any]:
    """What the HTTP process needs to know: limits for validation, the pool, the config."""
    mc = scheduler.runner.model_config
    return {"limits": scheduler.limits.to_dict(), "model_dir": str(scheduler.runner.model_dir),
            "architecture": mc.architecture, "page_size": scheduler.page_size,
            "max_total_tokens": scheduler.allocator.total_tokens,
            "kv_bytes_per_token": scheduler.memory.layout.bytes_per_token,
            "num_threads": scheduler.runner.num_threads, "mkl": scheduler.runner.mkl,
            "device": str(scheduler.runner.device),
            "dtype": str(scheduler.runner.dtype).replace("torch.", ""),
            "attention_backend": scheduler.runner.backend.name,
            "attention_backend_fallback": scheduler.runner.backend_fallback, "config": config.to_kwargs(),
            "kv_events": scheduler.kv_events.describe() if scheduler.kv_events is not None else None,
            "lora_adapters": scheduler.lora_adapters()}


class ZmqInbox:
    """The scheduler loop's inbox in the server: decodes messages into loop commands, and tells
    the detokenizer how to detokenize each request it admits."""

    def __init__(self, socket: zmq.Socket, reply: zmq.Socket, parent_pid: int, reject, logger: logging.Logger,
                 healthy=lambda: True, to_detokenizer: zmq.Socket | None = None):
        self.socket, self.reply, self.parent_pid = socket, reply, parent_pid
        self.healthy = healthy  # False once the runner cannot compute (a tensor-parallel rank is lost)
        self.reject = reject  # reject(rid, message): an error output for a request that never ran
        self.logger = logger
        self.to_detokenizer = to_detokenizer

    def receive(self, block: bool) -> list[Command]:
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
                if e.kind is GenerateRequest and e.values and isinstance(e.values[0], str):
                    self.reject(e.values[0], str(e))  # one of ours, with values that do not validate
                else:
                    self.logger.error("dropping a message: %s", e)
                continue
            if command is not None:
                commands.append(command)

    def _command(self, msg) -> Command | None:
        if isinstance(msg, GenerateRequest):
            if self.to_detokenizer is not None:  # before any of its outputs, on the same socket
                self.to_detokenizer.send(encode(DetokenizeParams.of(msg.rid, msg.params)))
            return AddRequest(Req(msg.rid, list(msg.input_ids), msg.params, namespace=msg.namespace,
                                  logprob=msg.logprob, retention=msg.retention, bootstrap=msg.bootstrap,
                                  lora=msg.lora))
        if isinstance(msg, AbortMsg):
            return AbortRequest(msg.rid)
        if isinstance(msg, ControlRequest):
            if msg.kind == "shutdown":
                return Stop()
            fn = CONTROLS.get(msg.kind)
            if fn is None:
                self.reply.send(encode(ControlReply(msg.call_id, False, {"error": f"unknown control {msg.kind!r}"})))
                return None
            command = CallCore(lambda s, fn=fn, viewer=msg.viewer, args=msg.args or {}: fn(s, viewer, args))
            command.future.add_done_callback(lambda f, cid=msg.call_id: self._answer(cid, f))
            return command
        self.logger.error("unexpected %s on the scheduler's socket", type(msg).__name__)
        return None

    def _answer(self, call_id: str, future) -> None:
        error = future.exception()
        reply = (ControlReply(call_id, False, {"error": str(error), "kind": error_kind(error)}) if error
                 else ControlReply(call_id, True, future.result()))
        self.reply.send(encode(reply))


def run_scheduler_process(config: EngineConfig, endpoints: Endpoints, parent_pid: int) -> None:
    """Entry point of the scheduler process (started by `radixkv.server.launch`)."""
    logger = become_child(parent_pid, config.telemetry.log_level, "scheduler")
    ctx = zmq.Context(1)
    inbox_socket = ctx.socket(zmq.PULL)
    inbox_socket.bind(endpoints.scheduler)
    to_detokenizer = ctx.socket(zmq.PUSH)
    to_detokenizer.connect(endpoints.detokenizer)
    to_tokenizer = ctx.socket(zmq.PUSH)
    to_tokenizer.connect(endpoints.tokenizer)
    try:
        start = time.perf_counter()
        scheduler = EngineCore.load(config, progress=True)
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

    def deliver(outputs: list[ReqOutput]) -> None:
        if outputs:
            to_detokenizer.send(encode(TokenBatch(outputs)))

    inbox = ZmqInbox(inbox_socket, to_tokenizer, parent_pid,
                     lambda rid, message: deliver([ReqOutput.failed(rid, message, ErrorKind.INVALID_REQUEST)]),
                     logger, healthy=lambda: scheduler.runner.healthy, to_detokenizer=to_detokenizer)
    loop = SchedulerLoop(scheduler, deliver)
    try:
        loop.run(inbox)
        if not scheduler.runner.healthy:
            logger.error("stopping: %s", scheduler.runner.workers.failed)
            sys.exit(1)
    finally:
        scheduler.close()  # the grammar compiler and the other tensor-parallel ranks, if any
        for sock in (inbox_socket, to_detokenizer, to_tokenizer):
            sock.close(linger=500)
        ctx.term()
