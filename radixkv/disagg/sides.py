"""What the scheduler calls on each side of a prefill/decode pair (see `radixkv.disagg`).

`PrefillSide`: a request with a room computes its prompt alone (max_new_tokens 0, no grammar:
the decode server samples); when it finishes, its prompt is in the tree and the path up to the
last prompt token (whole pages) is locked and offered under the room until the sender releases
it. A request that ends otherwise tells the decode server why.

`DecodeSide`: a request with a room waits here before the queue. Its prompt but the last token,
in whole pages, is what a prefill server can send; what our tree already holds stays, pages are
reserved for the rest and pulled. Once pushed, they go into the tree and the request joins the
front of the queue: admission finds them cached and computes the last prompt token, which gives
the first output token. A request the pool has no room for waits (retried each step) until its
timeout; then, as on any failure, it ends with an error and its pages go back -- after the
receiver says they are settled (no late write can land on them).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field, replace
from typing import Any

from radixkv.disagg.receiver import KVReceiver
from radixkv.disagg.sender import KVSender
from radixkv.disagg.wire import PullPages, prompt_digest
from radixkv.errors import ErrorKind
from radixkv.mem import PrefixCache, SeqPages
from radixkv.outputs import ReqOutput
from radixkv.sched.request import Req

logger = logging.getLogger(__name__)
IDLE_SLEEP = 0.001  # seconds a step with only transfers in flight waits


@dataclass
class TransferStats:
    """What travelled (decode side: received; prefill side: sent), for /server_info and /metrics."""

    mode: str
    transfers: int = 0
    tokens: int = 0
    nbytes: int = 0
    seconds: float = 0.0
    local_prefix_tokens: int = 0  # decode: prompt tokens its own tree already held (not pulled)
    failed: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {"disaggregation_mode": self.mode, "disagg_transfers": self.transfers,
                "disagg_transferred_tokens": self.tokens, "disagg_transferred_bytes": self.nbytes,
                "disagg_transfer_seconds": round(self.seconds, 6),
                "disagg_local_prefix_tokens": self.local_prefix_tokens, "disagg_failed": self.failed}


def transferable(num_prompt_tokens: int, page_size: int) -> int:
    """Tokens of a prompt a decode server takes from its prefill server: all but the last (its
    logits give the first output token), in whole pages."""
    n = max(0, num_prompt_tokens - 1)
    return n - n % page_size


class PrefillSide:
    def __init__(self, sender: KVSender, cache: PrefixCache, page_size: int):
        self.sender, self.cache, self.page_size = sender, cache, page_size
        self.held: dict[int, list[Any]] = {}  # room -> the locked nodes of its offers
        self.stats = TransferStats("prefill")

    def prepare(self, req: Req) -> None:
        """The prompt alone runs here (before the engine looks at its grammar: none)."""
        req.params = replace(req.params, max_new_tokens=0, min_new_tokens=0, regex=None, json_schema=None,
                             ebnf=None, stop=(), stop_regex=())

    def accept(self, req: Req, ready: Any) -> None:
        ready.append(req)

    def finished(self, req: Req, reason: dict[str, Any]) -> None:
        """After `req` released its KV into the tree: offer its pages, or say why there are none."""
        room = req.bootstrap.room
        if reason.get("type") == "abort":
            self.sender.fail(room, f"the prefill server ended the request: {reason.get('message', 'aborted')}")
            self.stats.failed += 1
            return
        end = transferable(len(req.prompt_ids), self.page_size)
        key = req.prompt_ids[:end]
        match = self.cache.settle(self.cache.peek(key, req.namespace))
        if match.num_tokens < end:  # cannot happen while the tree keeps what a request computed
            self.sender.fail(room, f"the prefill server kept {match.num_tokens} of the prompt's {end} tokens")
            self.stats.failed += 1
            return
        self.cache.lock(match.last_node)
        self.held.setdefault(room, []).append(match.last_node)
        self.sender.offer(room, list(match.pages), prompt_digest(key, req.namespace))

    def poll(self, ready: Any) -> list[ReqOutput]:
        """Unlock the offers the sender is done with (nothing ends here: `ready` is unused)."""
        for room, second in self.sender.take_released():
            nodes = self.held.get(room)
            if not nodes:
                continue
            self.cache.unlock(nodes.pop(-1 if second else 0))
            if not nodes:
                del self.held[room]
        s, sent = self.stats, self.sender.stats
        s.transfers, s.tokens, s.nbytes, s.seconds = sent.transfers, sent.tokens, sent.nbytes, sent.seconds
        return []

    @property
    def busy(self) -> bool:
        return bool(self.held)

    waiting_requests = 0  # its requests wait in the scheduler's own queue

    def held_pages(self) -> list[int]:
        return []  # offered pages belong to the tree (locked), not to a request

    def abort(self, req: Req) -> bool:
        return False  # a prefill request runs in the scheduler's own queues

    def close(self) -> None:
        for nodes in self.held.values():
            for node in nodes:
                self.cache.unlock(node)
        self.held.clear()
        self.sender.close()


@dataclass(slots=True)
class Pulling:
    req: Req
    seq: SeqPages  # our pages for the prompt's first `end` tokens (the cached prefix + the pulled ones)
    node: Any  # the locked end of the cached prefix
    start: int  # tokens our tree held
    end: int


@dataclass(slots=True)
class Pending:
    req: Req
    deadline: float
    tried: int = field(default=0)


class DecodeSide:
    def __init__(self, receiver: KVReceiver, cache: PrefixCache, memory, reserve, page_size: int,
                 default_port: int, timeout: float):
        self.receiver, self.cache, self.memory, self.reserve = receiver, cache, memory, reserve
        self.page_size, self.default_port, self.timeout = page_size, default_port, timeout
        self.pending: dict[str, Pending] = {}  # rid -> not pulled yet (no room in the pool so far)
        self.pulling: dict[int, Pulling] = {}  # room -> its pull in flight
        self.unsettled: dict[int, SeqPages] = {}  # room -> pages that may still be written
        self.stats = TransferStats("decode")

    def prepare(self, req: Req) -> None:
        pass

    def accept(self, req: Req, ready: Any) -> None:
        """`req` (its grammar compiled, if any) waits here for its pages, then joins `ready`."""
        self.pending[req.rid] = Pending(req, time.monotonic() + self.timeout)

    def finished(self, req: Req, reason: dict[str, Any]) -> None:
        pass

    @property
    def busy(self) -> bool:
        return bool(self.pending or self.pulling or self.unsettled)

    @property
    def waiting_requests(self) -> int:
        """Requests waiting here for their pages."""
        return len(self.pending) + len(self.pulling)

    def poll(self, ready: Any) -> list[ReqOutput]:
        """Start pulls, take their outcomes: pushed requests join the front of `ready` (the
        scheduler's waiting deque); failed ones end (their outputs returned, `end_request` having
        been called on each)."""
        outputs = []
        for rid in list(self.pending):
            outputs += self._start(self.pending[rid], ready)
        for outcome in self.receiver.take_outcomes():
            pull = self.pulling.pop(outcome.room, None)
            if pull is None:
                continue
            if outcome.pushed:
                self._arrived(pull, outcome)
                ready.appendleft(pull.req)
            else:
                self.cache.unlock(pull.node)
                self.unsettled[outcome.room] = pull.seq
                outputs.append(self._fail(pull.req, outcome.message))
        for room in self.receiver.take_settled():
            seq = self.unsettled.pop(room, None)
            if seq is not None:
                seq.release()
        return outputs

    def _start(self, pending: Pending, ready: Any) -> list[ReqOutput]:
        req = pending.req
        end = transferable(len(req.prompt_ids), self.page_size)
        key = req.prompt_ids[:end]
        match = self.cache.settle(self.cache.peek(key, req.namespace))
        start = match.num_tokens
        if end - start <= 0:  # our tree holds it all: nothing to pull
            del self.pending[req.rid]
            self.stats.local_prefix_tokens += start
            ready.append(req)
            return []
        self.cache.lock(match.last_node)
        seq = self.memory.sequence_from_prefix(match.pages, start)
        if not self.reserve(seq.pages_needed(end - start)):
            self.cache.unlock(match.last_node)
            seq.release()
            pending.tried += 1
            if time.monotonic() > pending.deadline:
                del self.pending[req.rid]
                return [self._fail(req, f"the decode server had no room for the KV of {end - start} prompt tokens "
                                        f"within {self.timeout:g} s")]
            return []
        del self.pending[req.rid]
        seq.extend(end - start)
        room = req.bootstrap.room
        if room in self.pulling or room in self.unsettled:
            self.cache.unlock(match.last_node)
            seq.release()
            return [self._fail(req, f"bootstrap_room={room}: another request here is using this room")]
        self.pulling[room] = Pulling(req, seq, match.last_node, start, end)
        self.stats.local_prefix_tokens += start
        msg = PullPages(room, self.receiver.identity, prompt_digest(key, req.namespace), self.receiver.session,
                        self.receiver.buffers, start, end, seq.pages[start // self.page_size:], self.timeout)
        self.receiver.pull(req.bootstrap.address(self.default_port), msg)
        return []

    def _arrived(self, pull: Pulling, outcome) -> None:
        req = pull.req
        self.cache.cache_finished(req.prompt_ids[:pull.end], pull.seq, pull.node, req.namespace)
        req.transferred_tokens = pull.end - pull.start
        s = self.stats
        s.transfers, s.tokens, s.nbytes, s.seconds = (s.transfers + 1, s.tokens + outcome.tokens,
                                                      s.nbytes + outcome.nbytes, s.seconds + outcome.seconds)

    def _fail(self, req: Req, message: str) -> ReqOutput:
        self.stats.failed += 1
        self.end_request(req, {"type": "abort", "message": message})
        return req.take_output(message, ErrorKind.UNAVAILABLE)

    end_request = None  # set by the scheduler: finishes a request that held no KV row

    def abort(self, req: Req) -> bool:
        """`req` is leaving (its client went): forget it here; whether it was here."""
        if self.pending.pop(req.rid, None) is not None:
            return True
        for room, pull in list(self.pulling.items()):
            if pull.req is req:
                del self.pulling[room]
                self.cache.unlock(pull.node)
                self.unsettled[room] = pull.seq
                self.receiver.cancel(room)
                return True
        return False

    def held_pages(self) -> list[int]:
        """Pages held by pulls and unsettled rooms (beside the tree's)."""
        return [p for pull in self.pulling.values() for p in pull.seq.pages] + [
            p for seq in self.unsettled.values() for p in seq.pages]

    def close(self) -> None:
        self.receiver.close()
        for pull in self.pulling.values():
            self.cache.unlock(pull.node)
            pull.seq.release()
        for seq in self.unsettled.values():
            seq.release()
        self.pulling.clear()
        self.unsettled.clear()


def open_side(config, memory, cache: PrefixCache, reserve, model_dir) -> PrefillSide | DecodeSide | None:
    """The side `config.disagg` names, over `memory`'s pool (None: a whole server). `reserve(n)`
    makes n pages free (evicting), or says it cannot."""
    d = config.disagg
    if not d.enabled:
        return None
    from radixkv.disagg.transfer import PoolTransfer
    from radixkv.mem.storage_identity import model_fingerprint, storage_identity

    pool, page_size = memory.pool, memory.page_size
    identity = storage_identity(model_fingerprint(model_dir), config.cache.kv_cache_dtype, page_size,
                                pool.page_shapes())
    transfer = PoolTransfer([t for tensors in pool.storage for t in tensors], d.disaggregation_host,
                            d.disaggregation_ib_device)
    try:
        if d.disaggregation_mode == "prefill":
            sender = KVSender(transfer, identity, page_size, d.disaggregation_host, d.disaggregation_bootstrap_port,
                              d.disaggregation_transfer_timeout)
            logger.info("prefill server: bootstrap on %s:%d", d.disaggregation_host, d.disaggregation_bootstrap_port)
            return PrefillSide(sender, cache, page_size)
        receiver = KVReceiver(transfer, identity, d.disaggregation_transfer_timeout)
        return DecodeSide(receiver, cache, memory, reserve, page_size, d.disaggregation_bootstrap_port,
                          d.disaggregation_transfer_timeout)
    except BaseException:
        transfer.close()
        raise
