"""The grammar compiler process: `python -m radixkv.constrained.worker` (started by
`GrammarService`, not by hand).

It loads the model's tokenizer once, then compiles one grammar at a time: parse (xgrammar),
check that its outputs can end (`analysis.check_grammar`), compile against the vocabulary, and
send back the compiled grammar serialized (xgrammar's JSON), so the scheduler only deserializes
it. Its address space is capped at what it used once ready plus the memory budget, so a grammar
that needs more fails here (and this process is replaced) instead of growing the scheduler;
the time budget is the parent's to enforce (it kills a compile that runs too long).

Frames on stdin/stdout: a 4-byte big-endian length, then msgpack:
    parent -> worker  [job, kind, source]
    worker -> parent  [0, "ready"] once; then [job, "ok", compiled_json, jump_forward_safe]
                      or [job, "error", message] or [job, "memory", message] (then it exits)
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
from typing import BinaryIO

from radixkv.constrained.frames import read_frame, write_frame

OUT_OF_MEMORY = ("bad_alloc", "Resource temporarily unavailable", "Cannot allocate memory")
"""How allocations (and the compiler's threads) fail under the address-space cap."""


def address_space_bytes() -> int:
    """This process's virtual memory size (what RLIMIT_AS limits)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    return 0


def parse(kind: str, source: str):
    import xgrammar as xgr

    if kind == "regex":
        return xgr.Grammar.from_regex(source)
    if kind == "json_schema":
        return xgr.Grammar.from_json_schema(source, any_whitespace=False)
    return xgr.Grammar.from_ebnf(source)


def compile_one(compiler, kind: str, source: str) -> list:
    """[status, ...] for one grammar (see the module docstring)."""
    from radixkv.constrained.analysis import check_grammar
    from radixkv.grammar_spec import grammar_error_reason

    try:
        grammar = parse(kind, source)
    except MemoryError:
        raise
    except Exception as e:  # noqa: BLE001 - xgrammar raises several types for bad input
        if any(sign in str(e) for sign in OUT_OF_MEMORY):
            raise MemoryError(str(e)) from None
        return ["error", f"invalid {kind}: {grammar_error_reason(e)}"]
    verdict = check_grammar(grammar.serialize_json())
    if verdict.problem is not None:
        return ["error", verdict.problem]
    try:
        compiled = compiler.compile_grammar(grammar)
        return ["ok", compiled.serialize_json(), verdict.verified]
    except MemoryError:
        raise
    except Exception as e:  # noqa: BLE001
        if any(sign in str(e) for sign in OUT_OF_MEMORY):
            raise MemoryError(str(e)) from None
        return ["error", f"cannot compile: {grammar_error_reason(e)}"]


def serve(stdin: BinaryIO, stdout: BinaryIO, model_dir: str, vocab_size: int, stop_ids: list[int],
          memory_bytes: int) -> int:
    import xgrammar as xgr
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
    info = xgr.TokenizerInfo.from_huggingface(hf, vocab_size=vocab_size, stop_token_ids=stop_ids or None)
    compiler = xgr.GrammarCompiler(info, cache_enabled=False)
    if memory_bytes:
        cap = address_space_bytes() + memory_bytes
        resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
    write_frame(stdout, [0, "ready"])
    while (frame := read_frame(stdin)) is not None:
        job, kind, source = frame
        try:
            write_frame(stdout, [job, *compile_one(compiler, kind, source)])
        except MemoryError:
            write_frame(stdout, [job, "memory", "compiling it needed more memory than the budget"])
            return 3  # the heap may be broken: the parent starts a fresh process
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m radixkv.constrained.worker",
                                     description="The grammar compiler process (started by the scheduler).")
    parser.add_argument("--model-dir", required=True, help="the model directory (its tokenizer)")
    parser.add_argument("--vocab-size", type=int, required=True, help="the model's vocabulary size")
    parser.add_argument("--stop-ids", default="", help="comma-separated stop token ids")
    parser.add_argument("--memory-bytes", type=int, default=0, help="memory budget of one compile (0: none)")
    parser.add_argument("--parent-pid", type=int, required=True, help="exit when this process is gone")
    args = parser.parse_args(argv)

    from radixkv.procs import quiet_compute_threads, watch_parent

    quiet_compute_threads()
    watch_parent(args.parent_pid)
    stop_ids = [int(t) for t in args.stop_ids.split(",") if t]
    frames = os.fdopen(os.dup(1), "wb")  # the frames' own stream: anything a library prints goes to stderr
    os.dup2(2, 1)
    return serve(sys.stdin.buffer, frames, args.model_dir, args.vocab_size, stop_ids, args.memory_bytes)


if __name__ == "__main__":
    sys.exit(main())
