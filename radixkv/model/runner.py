"""ModelRunner: the model and one forward over the KV memory it is given.

`ModelRunner.load(config)` builds everything a runner needs from one `EngineConfig`: it loads
the checkpoint (prepacking linear layers on CPU), sets the compute threads, sizes a `KVMemory`
for the model (a token budget, or a share of free memory) and hands it to the runner; the
scheduler receives the same `KVMemory`. The runner keeps no per-request state: it runs forwards
for batches of requests described by their request-table rows and prefix lengths.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import torch

from radixkv.attention import ForwardBatch, ForwardMode, make_backend
from radixkv.attention.selfcheck import check_backend
from radixkv.config import EngineConfig
from radixkv.errors import ConfigError
from radixkv.mem import KVLayout
from radixkv.mem.kv_memory import KVMemory
from radixkv.model.compiled import (
    CompiledForward,
    check_compiled,
    choose_compile,
    describe_failure,
)
from radixkv.model.config import ModelConfig, check_tp_size
from radixkv.model.cpu_runtime import (
    choose_num_threads,
    packing_supported,
    tune_malloc,
    usable_cores,
)
from radixkv.cache_dirs import cache_root
from radixkv.model import mkl_dispatch
from radixkv.model.llama import LlamaForCausalLM
from radixkv.model.loader import load_model, resolve_model_dir
from radixkv.parallel.devices import rank_device, use_rank_device
from radixkv.parallel.group import SingleRank
from radixkv.parallel.shard import TPShard

logger = logging.getLogger(__name__)


def rank_threads(config: EngineConfig) -> int:
    """Torch threads of one rank: the `num_threads` option, else the usable cores shared out."""
    if config.runtime.num_threads is not None:
        return config.runtime.num_threads
    return max(1, usable_cores() // config.runtime.tp_size)


def kv_layout(config: EngineConfig, mc: ModelConfig, shard: TPShard) -> KVLayout:
    """The KV layout of one rank's pool: its KV heads (or MLA's one latent), every layer."""
    heads, head_dim, rope = mc.kv_heads_and_dim
    latent = rope is not None
    return KVLayout(mc.num_layers, heads if latent else shard.local(heads), head_dim, config.cache.page_size,
                    config.runtime.torch_dtype, config.cache.kv_cache_dtype, latent, rope or 0)


def load_rank_model(config: EngineConfig, model_dir: Path, shard: TPShard, comm, device: torch.device,
                    progress: bool) -> tuple[LlamaForCausalLM, int]:
    """This rank's part of the model, its linear layers prepacked on CPU; and how many were."""
    dtype = config.runtime.torch_dtype
    if device.type == "cpu":
        tune_malloc()
    model = load_model(model_dir, device, dtype, progress=progress, shard=shard, comm=comm)
    packed = model.prepack_for_cpu() if packing_supported(device, dtype) else 0
    return model, packed


class PeerRanks(Protocol):
    """The other tensor-parallel ranks, as rank 0's runner drives them (implemented above the
    runner, by `radixkv.tp.ranks.TPWorkers`: the runner only calls through this interface)."""

    size: int
    group: Any  # rank 0's collectives (`radixkv.parallel.group.TPGroup`)
    failed: str | None

    @property
    def healthy(self) -> bool: ...
    def wait_loaded(self) -> None: ...
    def start(self, memory: KVMemory) -> None: ...
    def send_forward(self, fb: ForwardBatch) -> None: ...
    def lost(self, cause: BaseException) -> Exception: ...
    def close(self) -> None: ...


LaunchPeers = Callable[[Path], PeerRanks]
"""launch_peers(model_dir): start ranks 1..N-1 for the model in `model_dir`."""


class ModelRunner:
    """Runs forwards of the model over its KV memory (one rank, or rank 0 of a TP group)."""

    def __init__(self, config: EngineConfig, model: LlamaForCausalLM, memory: KVMemory, model_dir: Path,
                 context_length: int, workers: PeerRanks | None = None):
        self.config = config
        self.model = model
        self.model_config = model.config
        self.memory = memory
        self.model_dir = model_dir
        self.context_length = context_length
        self.device = memory.device
        self.dtype = config.runtime.torch_dtype
        self.num_threads = None  # torch compute threads, when `load` chose them
        self.mkl: str | None = None  # what MKL runs (`mkl_dispatch.enable`), when `load` asked
        self.backend = make_backend(config.runtime.attention_backend_name, memory.pool, memory.req_table.table)
        self.backend_fallback: str | None = None  # why the configured backend was replaced, if it was
        if self.backend.name == "triton":
            self._check_kernels()
        self.workers = workers  # tensor-parallel ranks 1..N-1, when tp_size > 1
        self.compiled: CompiledForward | None = None  # the compiled forward, when `compile` chose it
        self.lora = None  # LoRAManager (radixkv.lora.pool), when LoRA adapters are enabled

    @classmethod
    def load(cls, config: EngineConfig, progress: bool = True, launch_peers: LaunchPeers | None = None
             ) -> ModelRunner:
        """Load the model named by `config` and give it a KV memory sized by `config`.

        With `tp_size` N > 1 this process becomes rank 0 and `launch_peers` starts ranks 1..N-1
        (`radixkv.tp.load_runner` passes it); each loads its shard, and the runner's forwards run
        on all of them.
        """
        mkl = mkl_dispatch.enable()  # before anything calls MKL: it chooses its kernels once
        num_threads = choose_num_threads(rank_threads(config))
        device, tp = rank_device(config, 0), config.runtime.tp_size
        if tp > 1:
            use_rank_device(device)
        model_dir = resolve_model_dir(config.runtime.model, config.runtime.cache_dir)
        mc = ModelConfig.from_file(model_dir / "config.json")
        check_tp_size(mc, tp, f"{model_dir / 'config.json'}")
        context_length = config.scheduler.context_length or mc.max_position_embeddings
        if context_length > mc.max_position_embeddings:
            raise ConfigError(f"context_length={context_length} exceeds the model's "
                              f"max_position_embeddings={mc.max_position_embeddings}")
        if tp > 1 and launch_peers is None:
            raise ConfigError(f"tp_size={tp}: load the runner with radixkv.tp.load_runner, which starts the ranks")
        workers = launch_peers(model_dir) if tp > 1 else None
        try:
            shard = TPShard(0, tp)
            model, packed = load_rank_model(config, model_dir, shard, workers.group if workers else SingleRank(),
                                            device, progress)
            if workers is not None:
                workers.wait_loaded()
            memory = KVMemory.sized(kv_layout(config, mc, shard), max_reqs=config.scheduler.max_running_requests,
                                    context_length=context_length, device=device,
                                    max_total_tokens=config.cache.max_total_tokens, mem_fraction=config.cache.kv_mem_fraction,
                                    host_kv_size=config.cache.host_kv_size, host_write_policy=config.cache.host_write_policy,
                                    shards=tp)
            if workers is not None:
                workers.start(memory)
        except BaseException:
            if workers is not None:
                workers.close()
            raise
        runner = cls(config, model, memory, model_dir, context_length, workers)
        runner.num_threads = num_threads
        runner.mkl = mkl
        if config.lora.enabled:
            runner.enable_lora()
        choice = choose_compile(config.runtime.compile, device, tp, moe=mc.moe is not None, lora=config.lora.enabled)
        if choice.enabled:
            runner.start_compiled(cache_root(config.runtime.cache_dir))
        else:
            logger.info("forward runs eager (%s)", choice.reason)
        layout = memory.layout
        logger.info(
            "model %s: %d layers, %d/%d heads, %s on %s; KV pool %d tokens (%d pages of %d), "
            "%.1f MiB, %d bytes/token (kv_cache_dtype %s); attention backend %s",
            mc.architecture, mc.num_layers, mc.num_heads, mc.num_kv_heads, str(config.runtime.torch_dtype).replace("torch.", ""),
            device, memory.total_tokens, memory.allocator.num_pages, config.cache.page_size,
            memory.pool.nbytes / 2**20, layout.bytes_per_token, config.cache.kv_cache_dtype, runner.backend.name,
        )
        if tp > 1:
            logger.info("tensor parallel over %d ranks: each holds %d/%d heads, %d/%d KV heads; the KV figures "
                        "above are one rank's", tp, mc.num_heads // tp, mc.num_heads, mc.num_kv_heads // tp,
                        mc.num_kv_heads)
        logger.info("%d torch threads (%s; %d usable cores); %s; MKL: %s", num_threads,
                    "num_threads option" if config.runtime.num_threads is not None else "from CPU affinity",
                    usable_cores(), f"{packed} linear layers prepacked for oneDNN" if packed
                    else "linear layers not prepacked (needs CPU + float32)", mkl)
        return runner

    def enable_lora(self) -> None:
        """Serve LoRA adapters: the adapter manager and its slots, the model's linears wrapped."""
        from radixkv.lora.layers import apply_lora
        from radixkv.lora.pool import LoRAManager

        self.lora = LoRAManager(self.config, self.model_config, self.device, self.dtype,
                                use_triton=self.backend.name == "triton")
        apply_lora(self.model, self.lora.slots)

    def prepare_lora(self, rows: list[tuple[int, str | None]]) -> None:
        """The next forward's rows as (tokens, adapter id or None), in order (LoRA only)."""
        if self.lora is not None:
            by_id = self.lora.by_id
            self.lora.slots.prepare([(n, by_id(a) if a is not None else None) for n, a in rows])

    def start_compiled(self, cache_root_dir: Path) -> None:
        """Compile the forward and check it once against eager mode on a small batch (a 3-token
        prefill, then one decode step); on a failure or a disagreement, log why and stay eager."""
        compiled = CompiledForward(self.model, cache_root_dir)
        start = time.perf_counter()
        try:
            problem = check_compiled(self, compiled)
        except Exception as e:  # noqa: BLE001 - anything the compiler raises leaves eager mode working
            problem = describe_failure(e)
        if problem is not None:
            compiled.fall_back(problem)
        compiled.finish_warmup()
        self.compiled = compiled
        if compiled.active:
            how = {"saved": f"loaded the saved graph from {compiled.aot_dir}", "process": "this process's graph",
                   "compiled": f"traced and compiled; saved under {compiled.aot_dir}"}[compiled.source]
            logger.info("forward compiled in %.1f s (%s)", time.perf_counter() - start, how)

    def moe_stats(self) -> dict[str, Any]:
        """Tokens routed to each expert of each mixture-of-experts layer (`get_stats()`):
        `expert_tokens` since start and `expert_tokens_last_step` (the last forward), each
        `{"layer": [tokens of expert 0, 1, ...]}`; `expert_load_imbalance` is the busiest expert's
        tokens over the mean, since start (1.0 = perfectly even). Empty for a dense model."""
        blocks = self.model.moe_blocks()
        if not blocks:
            return {}
        total = {str(i): b.tokens_per_expert.tolist() for i, b in blocks}
        counts = torch.stack([b.tokens_per_expert for _, b in blocks]).float()  # (layers, E)
        mean = counts.mean(-1)
        imbalance = float((counts.max(-1).values / mean.clamp(min=1e-9)).mean()) if bool((mean > 0).all()) else 0.0
        return {"expert_tokens": total,
                "expert_tokens_last_step": {str(i): b.last_tokens_per_expert.tolist() for i, b in blocks},
                "expert_load_imbalance": imbalance}

    def compile_stats(self) -> dict[str, Any]:
        """Whether the forward runs compiled, its graphs and recompilations (`get_stats()`)."""
        if self.compiled is None:
            return {"compiled": False, "compile_graphs": 0, "recompilations": 0, "compile_seconds": 0.0,
                    "compile_source": None, "compile_fallback": None}
        return self.compiled.stats()

    def _check_kernels(self) -> None:
        """Run the compiled kernels once against the torch reference (`attention.selfcheck`); on
        a failure, say so once and serve with the torch backend instead."""
        mc, layout = self.model_config, self.memory.layout
        heads = mc.num_heads * layout.num_kv_heads // mc.num_kv_heads  # this rank's query heads
        windows = dict.fromkeys(mc.sliding_windows or (None,))  # each attention span the layers use
        for window in windows:
            problem = check_backend(type(self.backend), layout, heads, self.device, window)
            if problem is not None:
                logger.error("attention kernels failed their start-up check, serving with the torch backend "
                             "instead: %s", problem)
                self.backend = make_backend("torch", self.memory.pool, self.memory.req_table.table)
                self.backend_fallback = problem
                return

    def close(self) -> None:
        """Stop the other tensor-parallel ranks, if any (idempotent)."""
        if self.workers is not None:
            self.workers.close()

    @property
    def healthy(self) -> bool:
        """False once a tensor-parallel rank is lost (a one-rank runner always is healthy)."""
        return self.workers is None or self.workers.healthy

    def parallel_stats(self) -> dict[str, float]:
        """Tensor-parallel figures: ranks, and this rank's time in collectives."""
        if self.workers is None:
            return {"tp_size": 1}
        return {"tp_size": self.workers.size, **self.workers.group.stats.to_dict()}

    @property
    def layout(self) -> KVLayout:
        return self.memory.layout

    @property
    def max_total_tokens(self) -> int:
        return self.memory.total_tokens

    def forward(self, fb: ForwardBatch) -> torch.Tensor:
        """Logits (N, V) float32 of the rows `fb.logits_index`; stores the new tokens' KV.

        With tensor parallelism the batch (and the journal of KV changes since the last one) goes
        to every rank first; a failure inside the joint forward loses the group
        (`TensorParallelError`), since the ranks can no longer agree where they are."""
        if self.workers is None:
            if self.compiled is not None:
                return self.compiled(fb, self.backend)
            return self.model(fb, self.backend)
        start = time.perf_counter()
        self.workers.send_forward(fb)
        try:
            logits = self.model(fb, self.backend)
        except Exception as e:
            raise self.workers.lost(e) from e
        except BaseException as e:  # Ctrl-C mid-forward: the other ranks are inside a collective
            self.workers.lost(e)
            raise
        stats = self.workers.group.stats
        stats.forwards += 1
        stats.forward_seconds += time.perf_counter() - start
        return logits

    def build_batch(
        self,
        mode: ForwardMode,
        token_ids: list[list[int]],
        req_rows: list[int],
        prefix_lens: list[int],
        out_cache_loc: list[int] | torch.Tensor,
        logits: str = "last",
    ) -> ForwardBatch:
        return ForwardBatch.build(mode, token_ids, req_rows, prefix_lens, out_cache_loc,
                                  device=self.device, logits=logits)
