"""The `radixkv` command line.

    radixkv serve                                          # HTTP server: native + OpenAI API
    radixkv generate "What is the capital of France?"     # one answer, streamed
    radixkv chat                                           # terminal chat, cached tokens per turn
    radixkv kv-size default --dtype all --memory 24GiB     # what the KV cache of a model costs
    radixkv plan mooncake --target-hit-rate 0.3            # KV memory a traced workload needs
    radixkv serve --help                                   # every flag, explained
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from radixkv.cli_flags import add_engine_flags, add_router_flags, add_server_flags, engine_options, router_config, server_config
from radixkv.version import __version__

SAMPLING_FLAGS = {
    "max_new_tokens": (int, 128, "tokens to generate at most"),
    "temperature": (float, 0.0, "sampling temperature; 0 (the default here) is greedy and deterministic"),
    "top_p": (float, 1.0, "nucleus sampling: keep the smallest set of tokens with this much probability"),
    "top_k": (int, -1, "keep only the k most likely tokens (-1: all)"),
    "min_p": (float, 0.0, "drop tokens less likely than min_p x the most likely one"),
    "seed": (int, None, "seed for this request's sampling"),
    "repetition_penalty": (float, 1.0, "divide the logits of tokens already seen (> 1 discourages repeats)"),
}


def add_sampling_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("sampling")
    for name, (kind, default, help_text) in SAMPLING_FLAGS.items():
        group.add_argument("--" + name.replace("_", "-"), type=kind, default=default,
                           help=f"{help_text} (default: {default})")
    group.add_argument("--stop", action="append", default=[], metavar="TEXT",
                       help="stop when this text appears (repeatable)")
    group.add_argument("--ignore-eos", action="store_true", help="keep going past end-of-sequence")


def sampling_params(args: argparse.Namespace) -> dict[str, Any]:
    params = {name: getattr(args, name) for name in SAMPLING_FLAGS}
    params.update(stop=list(args.stop), ignore_eos=args.ignore_eos)
    return {k: v for k, v in params.items() if v is not None}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="radixkv", description="An LLM runtime built around a radix-tree prefix cache.",
        formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("--version", action="version", version=f"radixkv {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    gen = sub.add_parser("generate", help="generate a completion for one prompt",
                         description="Generate an answer for PROMPT and stream it to stdout.")
    gen.add_argument("prompt", help="the prompt text")
    gen.add_argument("--raw", action="store_true",
                     help="send the text as is instead of as a user turn of the chat template")
    gen.add_argument("--no-stream", action="store_true", help="print the answer once, at the end")
    add_sampling_flags(gen)
    add_engine_flags(gen)

    srv = sub.add_parser(
        "serve", help="serve the model over HTTP (native /generate and the OpenAI API)",
        description="Serve the model over HTTP: POST /generate, /v1/chat/completions, /v1/completions; "
                    "GET /v1/models, /health, /server_info, /metrics, /cache_tree, /dashboard (a live page of the cache); "
                    "POST /flush_cache, /abort_request. "
                    "Prints one 'radixkv ready: URL' line once the model is loaded; Ctrl-C or SIGTERM "
                    "stops every process it started.")
    add_server_flags(srv)
    add_engine_flags(srv)

    chat = sub.add_parser("chat", help="chat in the terminal",
                          description="Chat with the model; after every answer, shows how many prompt "
                                      "tokens came from the prefix cache. Commands: /reset, /stats, /exit.")
    chat.add_argument("--system", default=None, help="system prompt for the conversation")
    add_sampling_flags(chat)
    add_engine_flags(chat)
    add_kv_size_parser(sub)
    from radixkv.plan_cli import add_plan_parser

    add_plan_parser(sub, _flag_type, _positive_int, _kv_dtypes)

    rtr = sub.add_parser(
        "router", help="route requests over several `radixkv serve` workers, by cached prefix",
        description="One HTTP front (the same API as `radixkv serve`) for N workers: each request goes to "
                    "the worker that probably has its prefix cached (cache_aware), or by round_robin / "
                    "least_load. Workers that fail are taken out and used again once healthy; a request "
                    "that failed before any reply is retried on another worker.")
    add_router_flags(rtr)
    return parser


def _flag_type(parse, what: str):
    """An argparse `type` turning a ConfigError into a usage error that names the flag."""
    def convert(text: str):
        from radixkv.errors import ConfigError

        try:
            return parse(text)
        except ConfigError as e:
            raise argparse.ArgumentTypeError(str(e)) from None
    convert.__name__ = what
    return convert


def _kv_dtypes(text: str) -> list[str]:
    from radixkv.kv_size import KV_DTYPES, canonical_kv_dtype

    if text.strip().lower() == "all":
        return list(KV_DTYPES)
    return [canonical_kv_dtype(name) for name in text.split(",")]


def _positive_int(text: str) -> int:
    from radixkv.errors import ConfigError

    if not text.strip().isdigit() or int(text) < 1:
        raise ConfigError(f"expected a positive integer, got {text!r}")
    return int(text)


def add_kv_size_parser(sub) -> None:
    from radixkv.kv_size import DEFAULT_CONTEXT, INT4_GROUP, KV_DTYPES, parse_size

    kv = sub.add_parser(
        "kv-size", help="how much KV cache a model needs per token, per request, per memory",
        description="Compute a model's KV-cache size from its config.json alone (no weights are read): "
                    "bytes per token, per request and per batch, and how many tokens fit a memory. "
                    "Understands MHA/GQA/MQA and DeepSeek-style MLA (one latent per layer). int8 stores "
                    f"one float32 scale per token per KV head; int4 one per {INT4_GROUP} elements of "
                    "head_dim. Sizes ignore page rounding and the pool's padding page.")
    kv.add_argument("model", metavar="MODEL_OR_CONFIG",
                    help="a model directory, a config.json file, or 'default' (the runtime's default "
                         "model, SmolLM2-135M-Instruct)")
    kv.add_argument("--dtype", type=_flag_type(_kv_dtypes, "KV dtype list"), default=["auto"],
                    metavar="DTYPE[,DTYPE...]|all",
                    help=f"KV dtype(s), comma-separated, or 'all' (every one but auto); each one of "
                         f"auto (the config's torch_dtype, float32 if absent), {', '.join(KV_DTYPES)} "
                         "(default: auto)")
    kv.add_argument("--context", type=_flag_type(_positive_int, "token count"), default=None,
                    metavar="N", help="tokens per request (default: the config's "
                                      f"max_position_embeddings, else {DEFAULT_CONTEXT})")
    kv.add_argument("--batch", type=_flag_type(_positive_int, "request count"), default=1, metavar="B",
                    help="requests held at once; adds a column with B requests of N tokens (default: 1)")
    kv.add_argument("--memory", type=_flag_type(parse_size, "size"), default=None, metavar="SIZE",
                    help="memory for KV, e.g. 24GiB, 80GB, 512MiB or plain bytes (KB/MB/GB: powers of "
                         "1000; KiB/MiB/GiB: of 1024); adds how many tokens and requests fit "
                         "(default: not shown)")
    kv.add_argument("--json", action="store_true", help="print the sizes as JSON instead of a table")


def make_engine(args: argparse.Namespace):
    from radixkv.engine import Engine

    return Engine(progress=True, **engine_options(args))


def run_generate(args: argparse.Namespace) -> int:
    engine = make_engine(args)
    try:
        if args.raw or engine.tokenizer is None or getattr(engine.tokenizer.hf, "chat_template", None) is None:
            request = {"prompt": args.prompt}
        else:
            request = {"input_ids": engine.tokenizer.apply_chat_template([{"role": "user", "content": args.prompt}])}
        start = time.perf_counter()
        if args.no_stream:
            out = engine.generate(sampling_params=sampling_params(args), **request)
            print(out["text"], flush=True)
            meta = out["meta_info"]
        else:
            meta = {}
            for chunk in engine.generate_stream(sampling_params=sampling_params(args), **request):
                print(chunk["text"], end="", flush=True)
                meta = chunk["meta_info"]
            print(flush=True)
        elapsed = time.perf_counter() - start
        print(f"[{meta['prompt_tokens']} prompt tokens, {meta['cached_tokens']} cached, "
              f"{meta['completion_tokens']} generated in {elapsed:.2f} s; "
              f"{describe_finish(meta['finish_reason'], engine.tokenizer)}]", file=sys.stderr)
    finally:
        engine.shutdown()
    return 0


def describe_finish(reason: dict[str, Any] | None, tokenizer=None) -> str:
    """A finish reason (`{"type": "stop", "matched": 2}`, ...) as words for a person."""
    if not reason:
        return "unfinished"
    kind = reason.get("type")
    if kind == "stop":
        matched = reason.get("matched")
        if isinstance(matched, str):
            return f"stopped at the stop string {matched!r}"
        if isinstance(matched, int):
            text = tokenizer.decode([matched], skip_special_tokens=False) if tokenizer is not None else ""
            return f"stopped at the end token {text or matched!r}" if text else f"stopped at token {matched}"
        return "stopped"
    if kind == "length":
        return f"stopped at the length limit ({reason.get('length')} new tokens)"
    if kind == "abort":
        return f"aborted: {reason.get('message', 'no reason given')}"
    return f"finished ({kind})"


def run_chat(args: argparse.Namespace) -> int:
    engine = make_engine(args)
    base = [{"role": "system", "content": args.system}] if args.system else []
    messages = list(base)
    print("radixkv chat: /reset starts over, /stats shows the cache, /exit (or Ctrl-D) quits",
          file=sys.stderr)
    try:
        while True:
            try:
                line = input("you> ").strip()
            except EOFError:
                print()
                break
            if not line:
                continue
            if line in ("/exit", "/quit"):
                break
            if line == "/reset":
                messages = list(base)
                continue
            if line == "/stats":
                s = engine.get_stats()
                print(f"hit rate {s['cache_hit_rate']:.1%}, {s['cached_tokens_in_tree']} tokens cached, "
                      f"{s['used_tokens']}/{s['total_tokens']} KV tokens in use", file=sys.stderr)
                continue
            messages.append({"role": "user", "content": line})
            ids = engine.tokenizer.apply_chat_template(messages)
            print("model> ", end="", flush=True)
            start, text, meta = time.perf_counter(), "", {}
            for chunk in engine.generate_stream(input_ids=ids, sampling_params=sampling_params(args)):
                print(chunk["text"], end="", flush=True)
                text += chunk["text"]
                meta = chunk["meta_info"]
            elapsed = time.perf_counter() - start
            messages.append({"role": "assistant", "content": text})
            share = meta["cached_tokens"] / max(1, meta["prompt_tokens"])
            print(f"\n  [prompt {meta['prompt_tokens']} tokens, {meta['cached_tokens']} from cache "
                  f"({share:.0%}); {meta['completion_tokens']} new tokens, "
                  f"{meta['completion_tokens'] / max(elapsed, 1e-9):.1f} tok/s]", file=sys.stderr)
    except KeyboardInterrupt:
        print(file=sys.stderr)
    finally:
        engine.shutdown()
    return 0


def run_serve(args: argparse.Namespace) -> int:
    from radixkv.config import EngineConfig
    from radixkv.server.launch import serve

    config = EngineConfig.from_kwargs(**engine_options(args))  # validated here, once, for every worker
    server = server_config(args)
    if config.runtime.node_rank > 0:  # another machine's share of the ranks: no HTTP, no scheduler
        from radixkv.tp.node import serve_node

        return serve_node(config)
    if server.dp != 1:
        from radixkv.router.launch import serve_data_parallel

        return serve_data_parallel(args)
    return serve(config, server)


def run_router(args: argparse.Namespace) -> int:
    from radixkv.router.launch import serve_router

    return serve_router(router_config(args))


def run_kv_size(args: argparse.Namespace) -> int:
    import json

    from radixkv import kv_size

    geometry = kv_size.read_kv_geometry(args.model)
    report = kv_size.kv_report(geometry, args.dtype, context=args.context, batch=args.batch,
                               memory_bytes=args.memory)
    print(json.dumps(report, indent=2) if args.json else kv_size.format_report(report))
    return 0


def run_plan(args: argparse.Namespace) -> int:
    from radixkv.plan_cli import run_plan as plan

    return plan(args)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    if args.command is None:
        parser.print_help()
        return 2
    from radixkv.errors import ConfigError, InvalidRequestError, ModelLoadError

    try:
        return {"generate": run_generate, "chat": run_chat, "serve": run_serve,
                "kv-size": run_kv_size, "router": run_router, "plan": run_plan}[args.command](args)
    except (ConfigError, ModelLoadError, InvalidRequestError) as e:
        print(f"radixkv: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
