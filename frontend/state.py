"""ProgramState: one running program -- the token ids it has sent, its text, its variables.

`s += expr` queues the expression on the state's executor (a thread per state), so a
program's forks run side by side and the runtime batches them; reading a variable, the text or
the messages waits for what was queued before.

**The token-prefix rule.** A state keeps the token ids of everything it has sent and only ever
appends: each new piece of text (a role's markup, a user's words, a few-shot example) is
tokenised on its own and its ids are appended; a `gen`'s output is appended as the very token
ids the model produced (cut where a stop ended it); a `select` appends the ids it scored. So an
earlier turn, and a fork's trunk, is always a token prefix of what follows and the radix cache
hits it -- where re-tokenising the whole text could merge tokens across a boundary ("4" + "2."
-> "42.") and miss. The price: text is tokenised the way it was written, piece by piece, so
start a piece with the space or newline that separates it from the previous one.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Iterator
from typing import Any

from radixkv.errors import FrontendError, UnknownVariableError

from .backends import Backend
from .ir import ROLES, Concat, Expr, Gen, Role, Select, Text, as_expr, flatten

logger = logging.getLogger(__name__)
_STOP = object()


class _OpenRole:
    __slots__ = ("role", "start")

    def __init__(self, role: str, start: int):
        self.role, self.start = role, start  # start: index in text parts where its content begins


class ProgramState:
    """The state a program builds (see the module docstring for the token-prefix rule)."""

    def __init__(self, backend: Backend, _parent: ProgramState | None = None):
        self.backend = backend
        self.roles = backend.chat_roles()
        self.error: BaseException | None = None
        if _parent is None:
            self._ids: list[int] = []
            self._parts: list[str] = []
            self._messages: list[dict[str, str]] = []
            self._vars: dict[str, Any] = {}
            self._metas: dict[str, dict] = {}
            self._open: _OpenRole | None = None
        else:  # a fork: the trunk's copy, then its own way
            self._ids, self._parts = list(_parent._ids), list(_parent._parts)
            self._messages = [dict(m) for m in _parent._messages]
            self._vars, self._metas = dict(_parent._vars), dict(_parent._metas)
            self._open = None if _parent._open is None else _OpenRole(_parent._open.role, _parent._open.start)
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._pending = 0
        self._cond = threading.Condition()
        self._live: list[str] = []  # every piece of text as it is added (streams included)
        self._var_chunks: dict[str, list[str]] = {}
        self._var_done: set[str] = set()
        self._closed = False  # the program has returned: nothing more will be queued

    # -- adding to the state ---------------------------------------------------------------------
    def __iadd__(self, expr: Expr | str) -> ProgramState:
        self._submit(as_expr(expr))
        return self

    def system(self, content: Expr | str | None = None):
        return self._role("system", content)

    def user(self, content: Expr | str | None = None):
        return self._role("user", content)

    def assistant(self, content: Expr | str | None = None):
        return self._role("assistant", content)

    def _role(self, role: str, content):
        if content is not None:
            return Role(role, as_expr(content))
        return RoleBlock(self, role)

    def fork(self, n: int) -> ForkGroup:
        """`n` states that continue from this one's text so far, run side by side. The trunk is
        computed (and cached) once before they start."""
        if not isinstance(n, int) or n < 1:
            raise FrontendError(f"fork({n!r}): need a positive number of branches")
        self.sync()
        if n > 1 and self._ids:
            self.backend.prefill(list(self._ids))
        return ForkGroup(self, [ProgramState(self.backend, _parent=self) for _ in range(n)])

    # -- reading it ------------------------------------------------------------------------------
    def __getitem__(self, name: str) -> Any:
        return self.get_var(name)

    def get_var(self, name: str) -> Any:
        self.sync()
        if name not in self._vars:
            raise UnknownVariableError(f"no variable {name!r} in this state; it has {sorted(self._vars)}")
        return self._vars[name]

    def set_var(self, name: str, value: Any) -> None:
        self.sync()
        self._vars[name] = value

    def text(self) -> str:
        """Everything the program sent and generated, chat-template markup included."""
        self.sync()
        return "".join(self._parts)

    def token_ids(self) -> list[int]:
        """The token ids the program has sent so far (what the runtime cached)."""
        self.sync()
        return list(self._ids)

    def messages(self) -> list[dict[str, str]]:
        """The conversation as `[{"role", "content"}, ...]`, one entry per finished message."""
        self.sync()
        return [dict(m) for m in self._messages]

    def meta(self, name: str) -> dict[str, Any]:
        """What the runtime reported for `name`'s `gen` or `select`: prompt_tokens, cached_tokens,
        completion_tokens, finish_reason (and a select's `scores`)."""
        self.sync()
        if name not in self._metas:
            raise UnknownVariableError(f"no gen or select named {name!r} in this state; it has {sorted(self._metas)}")
        return self._metas[name]

    def sync(self) -> ProgramState:
        """Wait until everything queued so far has run; re-raise the first error it hit."""
        self.backend.wait_until(self._idle)
        if self.error is not None:
            raise self.error
        return self

    def text_iter(self, var: str | None = None) -> Iterator[str]:
        """Text as it is produced: all of it, or only variable `var`'s (as its gen streams)."""
        seen = 0
        while True:
            def ready():
                with self._cond:
                    chunks = self._live if var is None else self._var_chunks.get(var, [])
                    return len(chunks) > seen or self._finished(var) or self.error is not None

            self.backend.wait_until(ready)
            with self._cond:
                chunks = self._live if var is None else self._var_chunks.get(var, [])
                new, done = chunks[seen:], self._finished(var)
            seen += len(new)
            yield from new
            if self.error is not None and not new:
                raise self.error
            if done and seen >= len(self._live if var is None else self._var_chunks.get(var, [])):
                return

    def _finished(self, var: str | None) -> bool:
        if var is None:
            return self._closed and self._pending == 0
        if var in self._var_done:
            return True
        if self._closed and self._pending == 0:  # the program ended without it
            raise UnknownVariableError(f"the program never generated {var!r}")
        return False

    # -- the executor ----------------------------------------------------------------------------
    def _idle(self) -> bool:
        with self._cond:
            return self._pending == 0

    def _submit(self, item) -> None:
        with self._cond:
            self._pending += 1
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="radixkv-program", daemon=True)
                self._thread.start()
        self._queue.put(item)

    def _close(self) -> None:
        """The program returned: let the executor thread end once its queue is empty."""
        with self._cond:
            self._closed = True
        self._queue.put(_STOP)

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is _STOP:
                return
            try:
                if self.error is None:  # after an error the rest of the program is skipped
                    self._execute(item)
            except BaseException as e:  # noqa: BLE001 - kept on the state, raised at its next sync
                self.error = e
            finally:
                with self._cond:
                    self._pending -= 1
                    self._cond.notify_all()

    def _execute(self, item) -> None:
        if callable(item) and not isinstance(item, Expr):
            item()
            return
        for leaf in flatten(item):
            if isinstance(leaf, Text):
                self._append_text(leaf.text)
            elif isinstance(leaf, Role):
                self._open_role(leaf.role)
                if leaf.content is not None:
                    self._execute(leaf.content)
                self._close_role(leaf.role)
            elif isinstance(leaf, Gen):
                self._gen(leaf)
            elif isinstance(leaf, Select):
                self._select(leaf)
            elif isinstance(leaf, Concat):
                self._execute(leaf)
            else:
                raise FrontendError(f"cannot add {leaf!r} to a program")

    def _append(self, text: str, ids: list[int], live: bool = True) -> None:
        self._ids.extend(ids)
        self._parts.append(text)
        if live:
            with self._cond:
                self._live.append(text)
                self._cond.notify_all()

    def _append_text(self, text: str) -> None:
        if text:
            self._append(text, list(self.backend.encode(text)))

    def _open_role(self, role: str) -> None:
        if role not in ROLES:
            raise FrontendError(f"unknown role {role!r}; use one of {ROLES}")
        if self._open is not None:
            raise FrontendError(f"cannot open a {role} message inside the open {self._open.role} message")
        r = self.roles
        if self._messages:
            prefix = r.prefixes[role]
        else:  # the conversation's first message: what the template puts before it
            prefix = r.first_system_prefix if role == "system" else r.implicit_system + r.prefixes[role]
        self._append_text(prefix)
        self._open = _OpenRole(role, len(self._parts))

    def _close_role(self, role: str) -> None:
        if self._open is None or self._open.role != role:
            where = "no message is open" if self._open is None else f"the open message is {self._open.role}"
            raise FrontendError(f"cannot close a {role} message: {where}")
        content = "".join(self._parts[self._open.start:])
        self._open = None
        self._append_text(self.roles.suffixes[role])
        self._messages.append({"role": role, "content": content})

    def _gen(self, g: Gen) -> None:
        name = g.name

        def on_text(delta: str) -> None:
            with self._cond:
                self._live.append(delta)
                if name is not None:
                    self._var_chunks.setdefault(name, []).append(delta)
                self._cond.notify_all()

        result = self.backend.generate(list(self._ids), dict(g.sampling), on_text=on_text)
        self._append(result.text, self._kept_ids(result), live=False)
        if name is not None:
            self._vars[name], self._metas[name] = result.text, result.meta
            with self._cond:
                self._var_done.add(name)
                self._cond.notify_all()

    def _kept_ids(self, result) -> list[int]:
        """The generated ids to keep in the state: up to what its text shows (no EOS or stop
        token, no stop string), so they stay a token prefix of the next request."""
        ids, reason = result.output_ids, result.meta.get("finish_reason") or {}
        if reason.get("type") == "stop" and isinstance(reason.get("matched"), int):
            return ids[:-1]
        if reason.get("type") == "stop" and isinstance(reason.get("matched"), str):
            for k in range(len(ids), -1, -1):  # the stop string is in the last few tokens
                if self.backend.decode(ids[:k]) == result.text:
                    return ids[:k]
            return list(self.backend.encode(result.text))  # it began mid-token: re-tokenise
        return ids

    def _select(self, s: Select) -> None:
        if not s.choices or not all(isinstance(c, str) and c for c in s.choices):
            raise FrontendError(f"select {s.name!r}: choices must be non-empty strings")
        if s.method not in ("sum", "mean"):
            raise FrontendError(f"select {s.name!r}: method must be 'sum' or 'mean', got {s.method!r}")
        prefix = list(self._ids)
        if not prefix:
            raise FrontendError(f"select {s.name!r}: needs some text before it to score the choices after")
        encoded = [list(self.backend.encode(c)) for c in s.choices]
        if len(s.choices) > 1:
            self.backend.prefill(prefix)  # the choices then share its cached KV
        results = self.backend.prompt_logprobs([prefix + ids for ids in encoded], len(prefix))
        scores = []
        for lps, _ in results:
            total = sum(lps)
            scores.append(total / len(lps) if s.method == "mean" else total)
        best = max(range(len(scores)), key=scores.__getitem__)
        self._append(s.choices[best], encoded[best])
        if s.name is not None:
            self._vars[s.name] = s.choices[best]
            self._metas[s.name] = {"scores": dict(zip(s.choices, scores)), "method": s.method,
                                   "prompt_tokens": results[best][1]["prompt_tokens"],
                                   "cached_tokens": [m["cached_tokens"] for _, m in results]}
            with self._cond:
                self._var_done.add(s.name)
                self._cond.notify_all()


class RoleBlock:
    """`with s.user(): s += ...`: opens the message on enter, closes it on exit (once)."""

    def __init__(self, state: ProgramState, role: str):
        self.state, self.role, self.used = state, role, False

    def __enter__(self) -> ProgramState:
        if self.used:
            raise FrontendError(f"this {self.role} block is closed; open a new one with s.{self.role}()")
        self.used = True
        self.state._submit(lambda: self.state._open_role(self.role))
        return self.state

    def __exit__(self, *exc) -> None:
        self.state._submit(lambda: self.state._close_role(self.role))


class ForkGroup:
    """The branches of `s.fork(n)`: iterate, index, and `join()` them."""

    def __init__(self, parent: ProgramState, children: list[ProgramState]):
        self.parent, self.children = parent, children
        self._trunk_vars = set(parent._vars)
        self._trunk = (len(parent._ids), len(parent._parts))  # the parent was synced by fork()

    def __iter__(self):
        return iter(self.children)

    def __getitem__(self, i: int) -> ProgramState:
        return self.children[i]

    def __len__(self) -> int:
        return len(self.children)

    def join(self, mode: str = "gather_variable") -> list[ProgramState]:
        """Wait for every branch. "gather_variable": each variable the branches set becomes, in
        the parent, the list of their values; "concat": the branches' new text is appended to the
        parent too, in order (its tokens included)."""
        if mode not in ("gather_variable", "concat"):
            raise FrontendError(f"join(mode={mode!r}): use 'gather_variable' or 'concat'")
        for child in self.children:
            child.sync()
        names = sorted({n for c in self.children for n in c._vars} - self._trunk_vars)
        trunk_ids, trunk_parts = self._trunk

        def merge():
            for n in names:
                self.parent._vars[n] = [c._vars.get(n) for c in self.children]
                self.parent._metas[n] = [c._metas.get(n) for c in self.children]
            if mode == "concat":
                for c in self.children:
                    self.parent._append("".join(c._parts[trunk_parts:]), c._ids[trunk_ids:])

        self.parent._submit(merge)
        self.parent.sync()
        return self.children
