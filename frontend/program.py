"""`@function` programs, the primitives they use, and the default backend.

    import radixkv as rk

    @rk.function
    def qa(s, question):
        s += rk.system("You are a helpful assistant.")
        s += rk.user(question)
        s += rk.assistant(rk.gen("answer", max_tokens=64))

    rk.set_default_backend(rk.Runtime())             # or rk.RuntimeEndpoint("http://127.0.0.1:30000")
    state = qa.run(question="What is a radix tree?")
    state["answer"], state.meta("answer")["cached_tokens"]
"""

from __future__ import annotations

import functools
import inspect
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from radixkv.errors import FrontendError

from .backends import Backend
from .ir import Gen, Role, Select, as_expr
from .state import ProgramState

_default_backend: Backend | None = None


def set_default_backend(backend: Backend) -> None:
    """The backend `run` and `run_batch` use when not given one."""
    global _default_backend
    if not isinstance(backend, Backend):
        raise FrontendError(f"set_default_backend takes rk.Runtime(...) or rk.RuntimeEndpoint(url), "
                            f"not {type(backend).__name__}")
    _default_backend = backend


def _backend(backend: Backend | None) -> Backend:
    backend = backend or _default_backend
    if backend is None:
        raise FrontendError("no backend: call rk.set_default_backend(rk.Runtime()) (or RuntimeEndpoint(url)), "
                            "or pass backend=")
    return backend


def gen(name: str | None = None, max_tokens: int = 128, stop: str | list[str] | None = None,
        temperature: float = 0.0, top_p: float = 1.0, top_k: int = -1, min_p: float = 0.0,
        frequency_penalty: float = 0.0, presence_penalty: float = 0.0, repetition_penalty: float = 1.0,
        ignore_eos: bool = False, seed: int | None = None, regex: str | None = None,
        json_schema: dict | str | None = None, ebnf: str | None = None, jump_forward: bool = True) -> Gen:
    """Generate text into variable `name`. Greedy (`temperature=0`) unless told otherwise, so a
    program gives the same answer every run. `regex`, `json_schema` or `ebnf` constrain the
    text to a grammar (forced stretches are appended in one step unless `jump_forward=False`);
    a bad pattern fails here, where the program says it."""
    sampling = {"max_new_tokens": max_tokens, "temperature": temperature, "top_p": top_p, "top_k": top_k,
                "min_p": min_p, "frequency_penalty": frequency_penalty, "presence_penalty": presence_penalty,
                "repetition_penalty": repetition_penalty, "ignore_eos": ignore_eos}
    if stop is not None:
        sampling["stop"] = [stop] if isinstance(stop, str) else list(stop)
    if seed is not None:
        sampling["seed"] = seed
    for key, value in (("regex", regex), ("json_schema", json_schema), ("ebnf", ebnf)):
        if value is not None:
            sampling[key] = value
    if not jump_forward:
        sampling["jump_forward"] = False
    from radixkv.sampling_params import SamplingParams

    SamplingParams.from_dict(sampling)  # a bad value fails here, where the program says it
    return Gen(name, sampling)


def select(name: str | None = None, choices: list[str] | None = None, method: str = "sum") -> Select:
    """Append the choice the model finds most likely after the text so far, and store it in
    `name`. `method`: "sum" ranks by total log-likelihood, "mean" by log-likelihood per token."""
    if not choices:
        raise FrontendError(f"select {name!r}: give a non-empty list of choices")
    return Select(name, list(choices), method)


def system(content=None) -> Role:
    return Role("system", None if content is None else as_expr(content))


def user(content=None) -> Role:
    return Role("user", None if content is None else as_expr(content))


def assistant(content=None) -> Role:
    return Role("assistant", None if content is None else as_expr(content))


class Program:
    """A function `fn(s, **arguments)` that builds on a ProgramState."""

    def __init__(self, fn: Callable[..., Any]):
        params = list(inspect.signature(fn).parameters)
        if not params:
            raise FrontendError(f"@function {fn.__name__}: its first parameter receives the state (s)")
        self.fn = fn
        self.arg_names = params[1:]
        functools.update_wrapper(self, fn)

    def __call__(self, *args, **kwargs):
        raise FrontendError(f"call {self.fn.__name__}.run(...) (or run_batch) to run a program")

    def run(self, *, backend: Backend | None = None, stream: bool = False, **arguments) -> ProgramState:
        """Run once. Returns the finished state, or with `stream=True` at once, the program still
        running (read it with `state.text_iter(...)`; `state.sync()` waits for the end)."""
        state = ProgramState(_backend(backend))
        if stream:
            threading.Thread(target=self._execute, args=(state, arguments), daemon=True,
                             name=f"radixkv-{self.fn.__name__}").start()
            return state
        self._execute(state, arguments)
        if state.error is not None:
            raise state.error
        return state

    def run_batch(self, batch: list[dict[str, Any]], *, backend: Backend | None = None, num_threads: int = 8,
                  progress_bar: bool = False) -> list[ProgramState]:
        """Run the program once per argument dict, `num_threads` at a time, all batched by the
        runtime. A program that fails does not stop the others: its state's `error` says why."""
        if not isinstance(batch, list) or not all(isinstance(b, dict) for b in batch):
            raise FrontendError("run_batch takes a list of argument dicts")
        backend = _backend(backend)
        states = [ProgramState(backend) for _ in batch]
        if not batch:
            return states
        left = [len(batch)]
        lock = threading.Lock()
        bar = None
        if progress_bar:
            from tqdm import tqdm

            bar = tqdm(total=len(batch), desc=self.fn.__name__, unit="program")

        def one(i: int) -> None:
            self._execute(states[i], batch[i])
            with lock:
                left[0] -= 1
                if bar is not None:
                    bar.update(1)

        with ThreadPoolExecutor(max(1, num_threads), thread_name_prefix="radixkv-batch") as pool:
            for i in range(len(batch)):
                pool.submit(one, i)
            backend.wait_until(lambda: left[0] == 0)  # this thread drives an in-process runtime
        if bar is not None:
            bar.close()
        return states

    def _execute(self, state: ProgramState, arguments: dict[str, Any]) -> None:
        unknown = sorted(set(arguments) - set(self.arg_names))
        missing = [a for a in self.arg_names if a not in arguments
                   and inspect.signature(self.fn).parameters[a].default is inspect.Parameter.empty]
        try:
            if unknown or missing:
                raise FrontendError(f"{self.fn.__name__}.run: unknown argument(s) {unknown}" if unknown
                                    else f"{self.fn.__name__}.run: missing argument(s) {missing}")
            self.fn(state, **arguments)
            state.sync()
        except BaseException as e:  # noqa: BLE001 - the state carries it
            if state.error is None:
                state.error = e
        finally:
            state._close()


def function(fn: Callable[..., Any]) -> Program:
    """Decorate `fn(s, ...)` as a program: `fn.run(...)`, `fn.run_batch([...])`."""
    return Program(fn)
