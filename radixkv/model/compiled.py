"""The compiled forward: the whole layer stack as one inductor graph (`compile` option).

On a CPU a decode step of a small model is hundreds of eager ops of a few microseconds of work
each (norms, rotary, activations, views), and each costs its dispatch. `torch.compile` traces
`LlamaForCausalLM.forward_tokens` once into one graph, which inductor turns into fused C++
kernels around the two things it must not touch:

- **attention**, one `radixkv::attention` node per layer (`radixkv.attention.graph_op`): the
  paged backends store K/V and attend exactly as in eager mode, reading the batch's layout from
  the forward context;
- **prepacked linear layers**, one `radixkv::packed_linear` node each (`linear_ops`): oneDNN's
  blocked weights, which the compiler can neither trace nor cache.

On the CPU both operators have C++ kernels (built on first use), so a decode step's 151 calls
cost about 1.5 us each rather than 8-40 us through Python.

The token dimension (and the number of logits rows) is *unbacked*: the graph is compiled for
any size, so no batch size or prompt length recompiles it (`recompilations` in `get_stats()`
counts any that happen).

The forward is compiled ahead of time (`torch.compile(...).aot_compile`) and the compiled function
is saved whole -- dynamo's trace and guards with inductor's code -- under
`<inductor's cache>/aot/<graph key>.pt2`, the key a digest of everything the trace depends on
(`graph_key`). A later start loads it instead of tracing the model again (the default model's
second start: 12 s to the first answer instead of 20, `benchmarks/startup.py`), and calls it with
its guards checked once per runner, not on every step. The graph names no weights, so every load of the same
architecture -- in one process or the next -- reuses it. A saved function that does not load or
whose guards refuse this model is compiled again and replaced.

A compile that fails (no C++ compiler, an op the compiler rejects) or whose logits disagree with
eager mode on the start-up check never stops a server: it logs one line and the runner stays
eager (`compile_fallback` in `get_stats()` says why).
"""

from __future__ import annotations

import hashlib
import itertools
import logging
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from radixkv.attention.backend import AttentionBackend
from radixkv.attention.forward_batch import ForwardBatch, ForwardMode
from radixkv.attention.graph_op import GraphAttention, forward_context
from radixkv.errors import ConfigError
from radixkv.model.llama import LlamaForCausalLM
from radixkv.version import __version__

logger = logging.getLogger(__name__)

COMPILE_MODES = ("auto", "on", "off")
LOGITS_RTOL = 1e-4  # fp32: compiled and eager logits agree this closely (x the largest logit) at start-up
_graphs_compiled = 0  # graphs inductor compiled in this process, for the runner that asked
AOT_FORMAT = 1  # part of every graph key: bump when what a saved forward holds changes


@dataclass(frozen=True)
class CompileChoice:
    """Whether this runner compiles its forward, and why (for the start-up log)."""

    enabled: bool
    reason: str


def choose_compile(mode: str, device: torch.device, tp_size: int, moe: bool = False, lora: bool = False) -> CompileChoice:
    """Resolve the `compile` option against this runner; `on` where it cannot work is an error.

    `auto` compiles where it was measured to pay: one CPU rank (`benchmarks/compile_forward.py`:
    decode steps 3-9% faster, extends 5-6%). CUDA stays eager under `auto` until it has been
    measured there; `on` tries it. Mixture-of-experts models stay eager: the sorted dispatch
    runs each expert on as many tokens as the router sent it, a size the one-graph trace
    cannot know.
    """
    if mode not in COMPILE_MODES:
        raise ConfigError(f"compile={mode!r}: must be one of {COMPILE_MODES}")
    if mode == "off":
        return CompileChoice(False, "compile=off")
    if lora:
        if mode == "on":
            raise ConfigError("compile='on' with LoRA adapters: each batch's adapter segments differ, which the "
                              "one-graph trace cannot follow; use auto or off")
        return CompileChoice(False, "LoRA adapters: each batch mixes its own")
    if moe:
        if mode == "on":
            raise ConfigError("compile='on' for a mixture-of-experts model: its expert dispatch depends "
                              "on the routing, which the compiled graph does not trace; use compile='auto' or 'off'")
        return CompileChoice(False, "mixture of experts: eager")
    if tp_size > 1:
        if mode == "on":
            raise ConfigError("compile='on' with tp_size > 1: the tensor-parallel collectives are not "
                              "traced; use compile='auto' or 'off'")
        return CompileChoice(False, "tensor parallel: eager")
    if device.type == "cpu" and shutil.which(os.environ.get("CXX", "g++")) is None and shutil.which("c++") is None:
        return CompileChoice(False, "no C++ compiler on PATH (inductor needs one): eager")
    if mode == "auto" and device.type != "cpu":
        return CompileChoice(False, f"auto on {device.type}: eager (compiled only where measured)")
    return CompileChoice(True, f"compile={mode}")


def compile_cache_dir(cache_root: Path) -> Path:
    """Where inductor keeps this machine's compiled graphs: keyed by torch version and CPU
    capability (the model and dtype are part of each graph's own key)."""
    capability = torch.backends.cpu.get_cpu_capability().lower()
    return cache_root / "compiled" / f"torch-{torch.__version__}-{capability}"


def user_chose_inductor_cache() -> bool:
    """Whether `TORCHINDUCTOR_CACHE_DIR` names a directory of the user's choosing. Importing
    inductor sets it to inductor's own default under /tmp (a machine's first start imports it
    while converting the model), which is not a choice: the compiled forward saved there would
    be missed by the next start, which looks in radixkv's cache, and compiled again."""
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    chosen = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    return chosen is not None and os.path.abspath(chosen) != os.path.abspath(default_cache_dir())


def describe_failure(e: BaseException) -> str:
    """One line for a compile failure: the compiler's own error, not dynamo's wrapper of it."""
    inner = getattr(e, "inner_exception", None) or e
    lines = [line for line in str(inner).splitlines() if line.strip()]
    return f"{type(inner).__name__}: {lines[0][:300] if lines else ''}".rstrip(": ")


def _counting_inductor(gm, example_inputs):
    """Inductor, counting the graphs it is asked to compile."""
    global _graphs_compiled
    from torch._inductor.compile_fx import compile_fx

    _graphs_compiled += 1
    return compile_fx(gm, example_inputs)


def _traced(model: LlamaForCausalLM, input_ids, positions, logits_index) -> torch.Tensor:  # (N, V)
    return model.forward_tokens(input_ids, positions, logits_index, _GRAPH_ATTENTION, None)


_GRAPH_ATTENTION = GraphAttention()
_loaded: dict[str, Any] = {}  # saved path -> its AOT-compiled forward, shared by the runners of a process


def _traced_sources() -> list[Path]:
    """The source files the traced forward runs through (the model, its layers, attention)."""
    package = Path(__file__).resolve().parent.parent
    return sorted([*(package / "model").glob("*.py"), *(package / "attention").glob("*.py")])


def graph_key(model: LlamaForCausalLM) -> str:
    """A digest of everything the compiled forward depends on: torch and the CPU capability the
    kernels were built for, radixkv's version and the source of the traced code, the model's
    configuration and module tree (packed layers included), and each parameter's and buffer's
    name, shape, dtype and device. Two loads of one checkpoint -- or of two checkpoints of one
    architecture and size -- share it; anything that changes the trace changes it."""
    h = hashlib.sha256()
    for part in (f"aot-format-{AOT_FORMAT}", torch.__version__, torch.backends.cpu.get_cpu_capability(),
                 __version__, repr(model.config), repr(model)):
        h.update(part.encode() + b"\0")
    for name, t in itertools.chain(model.named_parameters(), model.named_buffers()):
        h.update(f"{name}:{tuple(t.shape)}:{t.dtype}:{t.device}\0".encode())
    for path in _traced_sources():
        h.update(path.read_bytes())
    return h.hexdigest()[:32]


def _aot_compile(model: LlamaForCausalLM, inputs: list[torch.Tensor]):
    """Trace and compile the forward for `inputs` of any length (their first dimension unbacked)."""
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)
    marked = [t.clone() for t in inputs]
    for t in marked:
        torch._dynamo.decorators.mark_unbacked(t, 0)  # no recompile per batch size or length
    wrapper = torch.compile(_traced, backend=_counting_inductor, fullgraph=True, dynamic=False)
    return wrapper.aot_compile(((model, *marked), {}))


def _load_saved(path: Path):
    """The forward saved at `path`. It was built for this machine's CPU capability (its key names
    it) by a compiler that built those vector instructions, so inductor's probe of the compiler's
    vector ISAs -- a compile and a load of a test library per ISA, 2 s -- is not run again for it."""
    import torch._inductor.config as inductor_config

    with open(path, "rb") as f, inductor_config.patch({"cpp.vec_isa_ok": True}):
        return torch.compiler.load_compiled_function(f)


class CompiledForward:
    """`model(fb, backend)` through the compiled graph, eager once it has fallen back."""

    def __init__(self, model: LlamaForCausalLM, cache_root: Path):
        self.model = model
        self.graphs = 0  # graphs compiled for this runner's calls (1 after warm-up, normally)
        self.warm_graphs: int | None = None  # graphs when warm-up ended
        self.compile_seconds = 0.0  # tracing and compiling, or loading the saved forward
        self.source: str | None = None  # where the forward came from: "compiled", "saved" or "process"
        self.fallback: str | None = None  # why this runner went back to eager, if it did
        if not user_chose_inductor_cache():  # the user's own choice wins
            directory = compile_cache_dir(cache_root)
            directory.mkdir(parents=True, exist_ok=True)
            os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(directory)
        self.aot_dir = Path(os.environ["TORCHINDUCTOR_CACHE_DIR"]) / "aot"  # beside inductor's own caches
        self._fn = None  # the AOT-compiled forward, once the first call has found or built it

    @property
    def active(self) -> bool:
        return self.fallback is None

    @property
    def recompilations(self) -> int:
        """Graphs compiled after warm-up: a batch shape the graph did not cover (should be 0)."""
        return 0 if self.warm_graphs is None else self.graphs - self.warm_graphs

    def __call__(self, fb: ForwardBatch, backend: AttentionBackend) -> torch.Tensor:  # (N, V)
        if self.fallback is not None:
            return self.model(fb, backend)
        try:
            with torch.inference_mode(), forward_context(backend, fb):
                # own storage (fb's are views into one buffer, at offsets a guard would pin), any size;
                # made under inference mode, as the graph's example inputs were
                inputs = [t.clone() for t in (fb.input_ids, fb.positions, fb.logits_index)]  # (T,), (T,), (N,)
                if self._fn is None:
                    self._fn = self._prepare(inputs)
                return self._fn(self.model, *inputs)
        except torch._dynamo.exc.TorchDynamoException as e:
            self.fall_back(describe_failure(e))
            return self.model(fb, backend)  # the K/V it stored are rewritten with the same values

    def _prepare(self, inputs: list[torch.Tensor]):
        """The compiled forward for this model: this process's, else the saved one, else compiled
        now (and saved). Its guards are checked here, against this model and these inputs; later
        calls skip them -- nothing they check (parameter shapes, dtypes, devices, grad mode, input
        dtypes) changes between one runner's forwards, and the input lengths are unbacked."""
        path = self.aot_dir / f"{graph_key(self.model)}.pt2"
        start, before = time.perf_counter(), _graphs_compiled
        fn, source = _loaded.get(str(path)), "process"
        if fn is None and path.exists():
            fn, source = self._try_saved(path), "saved"
        if fn is not None:
            refused = self._guards_refuse(fn, inputs)
            if refused:
                logger.warning("the compiled forward at %s does not fit this model (%s): compiling it again",
                               path, refused)
                fn = None
        if fn is None:
            fn, source = _aot_compile(self.model, inputs), "compiled"
            self._save(fn, path)
        _loaded[str(path)] = fn
        fn.disable_guard_check()
        self.graphs += _graphs_compiled - before
        self.compile_seconds += time.perf_counter() - start
        self.source = source
        return fn

    def _guards_refuse(self, fn, inputs: list[torch.Tensor]) -> str | None:
        """None if `fn`'s guards accept this model and these inputs, else the guard that failed."""
        try:
            if fn.guard_check(self.model, *inputs):
                return None
            failed = fn._artifacts.guard_manager.check_verbose(fn.prepare_f_locals(self.model, *inputs))
            return "; ".join(failed.verbose_code_parts)[:300] or "a guard failed"
        except Exception as e:  # noqa: BLE001 - a guard that cannot even run refuses too
            return f"its guards failed to run: {describe_failure(e)}"

    @staticmethod
    def _try_saved(path: Path):
        try:
            return _load_saved(path)
        except Exception as e:  # noqa: BLE001 - a stale or damaged file is compiled again, never fatal
            logger.warning("the saved compiled forward %s does not load (%s): compiling it again",
                           path, describe_failure(e))
            return None

    @staticmethod
    def _save(fn, path: Path) -> None:
        """Write `fn` for later starts (atomically: a concurrent start sees the old file or this)."""
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fn.save_compiled_function(str(path))
        except Exception as e:  # noqa: BLE001 - serving goes on; the next start compiles again
            logger.warning("the compiled forward could not be saved to %s (%s): the next start compiles "
                           "it again", path, describe_failure(e))

    def fall_back(self, why: str) -> None:
        if self.fallback is None:
            self.fallback = why
            logger.error("compiled forward disabled, running eager: %s", why)

    def finish_warmup(self) -> None:
        self.warm_graphs = self.graphs

    def stats(self) -> dict[str, float | int | str | None]:
        return {"compiled": self.active, "compile_graphs": self.graphs, "recompilations": self.recompilations,
                "compile_seconds": self.compile_seconds, "compile_source": self.source,
                "compile_fallback": self.fallback}


def logits_tolerance(dtype: torch.dtype) -> float:
    """How far compiled logits may sit from eager ones, relative to the largest eager logit."""
    return LOGITS_RTOL if dtype == torch.float32 else 2e-2


def check_compiled(runner, compiled: CompiledForward) -> str | None:
    """Run a 3-token prefill and one decode step both ways on `runner`'s memory; None if the
    compiled logits match eager ones, else how they differ. Frees what it allocated."""
    memory = runner.memory
    row, seq = memory.req_table.alloc(), memory.new_sequence()
    try:
        steps = ((ForwardMode.EXTEND, [1, 2, 3], 0), (ForwardMode.DECODE, [4], 3))
        for mode, tokens, prefix in steps:
            slots = seq.extend(len(tokens))
            memory.req_table.write(row, prefix, slots)
            fb = ForwardBatch.build(mode, [tokens], [row], [prefix], slots, device=runner.device)
            want = runner.model(fb, runner.backend)  # (1, V)
            got = compiled(fb, runner.backend)
            if not compiled.active:
                return None  # it fell back already, and said why
            err = (got - want).abs().max().item()
            scale = max(1.0, want.abs().max().item())
            if not err <= logits_tolerance(runner.dtype) * scale:  # NaN fails too
                return (f"{mode.value} logits differ from eager mode by {err:.3g} "
                        f"(tolerance {logits_tolerance(runner.dtype) * scale:.3g})")
        return None
    finally:
        seq.release()
        memory.req_table.free(row)
