"""Decoder-only causal LMs over the paged KV pool: the Llama family (Llama, Qwen2, Qwen3,
Mistral), Gemma 3, and DeepSeek V2/V3, Qwen3-MoE and Mixtral, from one set of blocks.

A layer is attention + MLP around two RMSNorms. Which attention (`Attention`: MHA/GQA/MQA, or
`radixkv.model.mla.MLAAttention`), which MLP (`SwiGLU`, GELU-tanh for Gemma, or
`radixkv.model.moe.MoEBlock`) and which norms (Gemma's (1 + w) norm, and its "sandwich" norms
after attention and after the MLP) follow from the `ModelConfig`.

The model holds no KV state of its own: every attention layer calls the attention backend with
the `ForwardBatch`, which stores the new tokens' K/V into the pool and reads the rest of each
request's KV through `req_to_token`. Parameter names follow Hugging Face except that q/k/v and
gate/up are fused (`qkv_proj`, `gate_up_proj`); the loader maps the checkpoint onto them.

Tensor parallelism (`radixkv.parallel`; the ranks are `radixkv.tp`'s): built with a `TPShard`, a
model holds one rank's heads, KV heads, MLP columns and vocabulary rows, and completes each layer
with one all-reduce after attention and one after the MLP; the logits of every rank's vocabulary
rows are gathered.
"""

from __future__ import annotations

import torch
from torch import nn

from radixkv.attention.backend import AttentionBackend
from radixkv.attention.forward_batch import ForwardBatch
from radixkv.model.config import ModelConfig
from radixkv.model.layers import (
    RMSNorm,
    RotaryEmbedding,
    SwiGLU,
    VocabParallelEmbedding,
    row_parallel_add,
    rotate,
)
from radixkv.model.mla import MLAAttention
from radixkv.model.moe import MoEBlock
from radixkv.parallel.group import SingleRank
from radixkv.parallel.shard import TPShard


class Attention(nn.Module):
    """Self-attention of one layer over this rank's heads (all of them on one rank)."""

    def __init__(self, config: ModelConfig, layer: int, shard: TPShard = TPShard(), comm=SingleRank()):
        super().__init__()
        self.layer = layer
        self.comm = comm
        self.num_heads = shard.local(config.num_heads)
        self.num_kv_heads = shard.local(config.num_kv_heads)
        self.head_dim = config.head_dim
        self.q_size, self.kv_size = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        self.sm_scale = config.query_scale if config.query_scale is not None else config.head_dim**-0.5
        self.sliding_window = config.sliding_windows[layer]
        self.qkv_proj = nn.Linear(
            config.hidden_size, self.q_size + 2 * self.kv_size, bias=config.attention_bias
        )
        self.o_proj = nn.Linear(self.q_size, config.hidden_size, bias=False)
        if config.qk_norm:  # Qwen3, Gemma 3: each head of q and of k normalised over head_dim before RoPE
            self.q_norm = RMSNorm(config.head_dim, config.rms_norm_eps, config.norm_offset)
            self.k_norm = RMSNorm(config.head_dim, config.rms_norm_eps, config.norm_offset)
        self.qk_norm = config.qk_norm

    def forward(
        self,
        x: torch.Tensor,  # (T, H)
        cos_sin: tuple[torch.Tensor, torch.Tensor],  # (T, 1, D) each
        backend: AttentionBackend,
        fb: ForwardBatch,
        residual: torch.Tensor | None,  # (T, H)
    ) -> torch.Tensor:  # (T, H): residual + attention output (the output alone when residual is None)
        T, D = x.shape[0], self.head_dim
        qkv = self.qkv_proj(x)  # (T, q_size + 2 * kv_size)
        qk_size = self.q_size + self.kv_size
        qk = qkv[:, :qk_size].view(T, self.num_heads + self.num_kv_heads, D)  # (T, Hq + Hkv, D)
        if self.qk_norm:
            q, k = qk.split([self.num_heads, self.num_kv_heads], dim=1)
            qk = torch.cat((self.q_norm(q), self.k_norm(k)), dim=1)  # (T, Hq + Hkv, D)
        # q and k rotate as one tensor of Hq + Hkv heads
        qk = rotate(qk, *cos_sin)
        q, k = qk.split([self.num_heads, self.num_kv_heads], dim=1)  # (T, Hq, D), (T, Hkv, D)
        v = qkv[:, qk_size:].view(T, self.num_kv_heads, D)  # (T, Hkv, D)
        o = backend.forward(q, k, v, self.layer, self.sm_scale, self.sliding_window, fb)  # (T, Hq, D)
        if residual is None:
            return self.comm.all_reduce(self.o_proj(o.reshape(T, self.q_size)))
        return row_parallel_add(self.o_proj, o.reshape(T, self.q_size), residual, self.comm)


class DecoderLayer(nn.Module):
    """Pre-norm attention and MLP, each added to the residual stream. With sandwich norms
    (Gemma 3) each block's output is normalised too before it is added:
    `x + post_attention_layernorm(attn(input_layernorm(x)))`, then
    `x + post_feedforward_layernorm(mlp(pre_feedforward_layernorm(x)))`."""

    def __init__(self, config: ModelConfig, layer: int, shard: TPShard = TPShard(), comm=SingleRank()):
        super().__init__()
        h, eps, offset = config.hidden_size, config.rms_norm_eps, config.norm_offset
        self.sandwich = config.sandwich_norms
        self.local_rope = config.sliding_windows[layer] is not None and config.local_rope is not None
        self.input_layernorm = RMSNorm(h, eps, offset)
        self.self_attn = MLAAttention(config, layer) if config.mla is not None else Attention(config, layer, shard, comm)
        self.post_attention_layernorm = RMSNorm(h, eps, offset)
        if self.sandwich:
            self.pre_feedforward_layernorm = RMSNorm(h, eps, offset)
            self.post_feedforward_layernorm = RMSNorm(h, eps, offset)
        if config.moe is not None and config.moe.moe_layers[layer]:
            self.mlp = MoEBlock(h, config.moe, config.hidden_act)
        else:
            self.mlp = SwiGLU(h, config.intermediate_size, shard, comm, config.hidden_act)

    def forward(self, x, rope_tables, backend, fb):  # (T, H) -> (T, H)
        cos_sin = rope_tables[1] if self.local_rope else rope_tables[0]
        if not self.sandwich:
            x = self.self_attn(self.input_layernorm(x), cos_sin, backend, fb, residual=x)
            return self.mlp(self.post_attention_layernorm(x), residual=x)
        x = x + self.post_attention_layernorm(self.self_attn(self.input_layernorm(x), cos_sin, backend, fb, None))
        return x + self.post_feedforward_layernorm(self.mlp(self.pre_feedforward_layernorm(x), residual=None))


class LlamaForCausalLM(nn.Module):
    """Every supported decoder (see the module docstring); `forward` returns logits of
    `fb.logits_index` rows.

    `config` describes the whole model; `shard` says which part of it this rank holds."""

    def __init__(self, config: ModelConfig, shard: TPShard = TPShard(), comm=SingleRank()):
        super().__init__()
        self.config = config
        self.shard, self.comm = shard, comm
        self.embed_tokens = VocabParallelEmbedding(config.vocab_size, config.hidden_size, shard, comm)
        self.layers = nn.ModuleList(DecoderLayer(config, i, shard, comm) for i in range(config.num_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps, config.norm_offset)
        rope_dim = config.rope_dim
        self.rotary = RotaryEmbedding(rope_dim, config.max_position_embeddings, config.rope)
        # Gemma 3's sliding layers rotate with their own base
        self.local_rotary = (RotaryEmbedding(rope_dim, config.max_position_embeddings, config.local_rope)
                             if config.local_rope is not None else None)
        if config.tie_word_embeddings:
            self.lm_head = None
        else:
            self.lm_head = nn.Linear(config.hidden_size, self.embed_tokens.weight.shape[0], bias=False)

    def num_parameters(self) -> int:
        """Parameters of the checkpoint (packed layers included, a tied output layer once)."""
        from radixkv.model.cpu_runtime import PackedLinear

        dense = sum(p.numel() for p in self.parameters())
        packed = sum(m.in_features * m.out_features + (m.bias.numel() if m.bias is not None else 0)
                     for m in self.modules() if isinstance(m, PackedLinear) and m is not self.tied_copy)
        return dense + packed

    @property
    def tied_copy(self) -> nn.Module | None:
        """The packed output layer made from a tied embedding, if any."""
        return self.lm_head if self.config.tie_word_embeddings else None

    def prepack_for_cpu(self) -> int:
        """Swap every linear layer for a oneDNN-prepacked copy (CPU, fp32); returns how many.

        A tied output layer gets a packed copy of the embedding (which stays dense for lookups).
        """
        from radixkv.model.cpu_runtime import PackedLinear, prepack_linears

        count = prepack_linears(self)
        if self.lm_head is None:
            self.lm_head = PackedLinear(self.embed_tokens.weight)
            count += 1
        return count

    def finish_load(self) -> None:
        """Weights derived from the checkpoint's, once it is loaded (MLA's absorbed projections)."""
        for module in self.modules():
            if module is not self and hasattr(module, "finish_load"):
                module.finish_load()

    def moe_blocks(self) -> list[tuple[int, MoEBlock]]:
        """(layer, block) of every mixture-of-experts layer."""
        return [(i, layer.mlp) for i, layer in enumerate(self.layers) if isinstance(layer.mlp, MoEBlock)]

    @torch.inference_mode()
    def forward(self, fb: ForwardBatch, backend: AttentionBackend) -> torch.Tensor:  # (N, V)
        backend.begin_forward(fb)
        return self.forward_tokens(fb.input_ids, fb.positions, fb.logits_index, backend, fb)

    def forward_tokens(
        self,
        input_ids: torch.Tensor,  # (T,)
        positions: torch.Tensor,  # (T,)
        logits_index: torch.Tensor,  # (N,)
        backend: AttentionBackend,
        fb: ForwardBatch | None,
    ) -> torch.Tensor:  # (N, V)
        """The forward on tensors alone, once `backend` has begun `fb`: what a compiled graph
        traces (`radixkv.model.compiled`, with `fb` None and a graph-op backend)."""
        cos_sin = self.rotary.cos_sin(positions)  # shared by every layer
        local = self.local_rotary.cos_sin(positions) if self.local_rotary is not None else cos_sin
        x = self.embed_tokens(input_ids)  # (T, H)
        if self.config.embed_scale != 1.0:  # Gemma: scaled in the weights' dtype, as transformers does
            x = x * torch.tensor(self.config.embed_scale, dtype=x.dtype)
        for layer in self.layers:
            x = layer(x, (cos_sin, local), backend, fb)
        x = self.norm(x[logits_index])  # (N, H): only the rows whose logits are asked for
        if self.lm_head is None:  # tied output layer
            logits = torch.nn.functional.linear(x, self.embed_tokens.weight)  # (N, Vp)
        else:
            logits = self.lm_head(x)  # (N, Vp)
        if self.comm.size > 1:
            logits = self.comm.all_gather(logits)[:, : self.config.vocab_size]  # (N, V)
        logits = logits.float()  # (N, V)
        cap = self.config.final_logit_softcapping
        return torch.tanh(logits / cap) * cap if cap else logits
