"""A tiny decoder-only transformer for the end-to-end harness: random weights
from a config and a seed, RMSNorm, RoPE, grouped-query attention over a paged
KV cache (either layout, through ``paged_attention``), SwiGLU MLP.

``step`` decodes one token for each request of a batch: it writes the new
token's K and V into its cache slot and attends over the request's blocks.
The projections go through ``gemm`` (torch matmul by default; the harness may
pass HybridGEMM).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from .layout import KVLayout, layer_kv
from .paged_attention import paged_attention

Gemm = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass(frozen=True, slots=True)
class TinyConfig:
    vocab_size: int = 101
    hidden: int = 64
    num_layers: int = 3
    num_heads: int = 4
    num_kv_heads: int = 2
    head_dim: int = 16
    ffn: int = 128
    block_size: int = 4
    rope_theta: float = 10000.0
    eps: float = 1e-6


@dataclass(frozen=True, slots=True)
class LayerWeights:
    attn_norm: torch.Tensor
    wq: torch.Tensor
    wk: torch.Tensor
    wv: torch.Tensor
    wo: torch.Tensor
    mlp_norm: torch.Tensor
    w_gate: torch.Tensor
    w_up: torch.Tensor
    w_down: torch.Tensor


def _matmul(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return x @ w


class TinyTransformer:
    def __init__(
        self,
        config: TinyConfig,
        *,
        seed: int = 0,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
        gemm: Gemm = _matmul,
    ) -> None:
        c = config
        if c.num_heads % c.num_kv_heads:
            raise ValueError("num_heads must be a multiple of num_kv_heads")
        gen = torch.Generator().manual_seed(seed)

        def rand(*shape: int, scale: float) -> torch.Tensor:
            return (torch.randn(*shape, generator=gen) * scale).to(dtype=dtype, device=device)

        def norm() -> torch.Tensor:
            return (1.0 + 0.1 * torch.randn(c.hidden, generator=gen)).to(dtype=dtype, device=device)

        s = c.hidden**-0.5
        self.config = c
        self.dtype = dtype
        self.device = torch.device(device)
        self.gemm = gemm
        self.embed = rand(c.vocab_size, c.hidden, scale=1.0)
        self.layers = [
            LayerWeights(
                attn_norm=norm(),
                wq=rand(c.hidden, c.num_heads * c.head_dim, scale=s),
                wk=rand(c.hidden, c.num_kv_heads * c.head_dim, scale=s),
                wv=rand(c.hidden, c.num_kv_heads * c.head_dim, scale=s),
                wo=rand(
                    c.num_heads * c.head_dim, c.hidden, scale=(c.num_heads * c.head_dim) ** -0.5
                ),
                mlp_norm=norm(),
                w_gate=rand(c.hidden, c.ffn, scale=s),
                w_up=rand(c.hidden, c.ffn, scale=s),
                w_down=rand(c.ffn, c.hidden, scale=c.ffn**-0.5),
            )
            for _ in range(c.num_layers)
        ]
        self.final_norm = norm()
        self.lm_head = rand(c.hidden, c.vocab_size, scale=s)

    def _rms(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.config.eps)
        return (xf * weight.float()).to(x.dtype)

    def _rope(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Rotate-half RoPE on ``(B, H, D)``."""
        half = x.shape[-1] // 2
        freqs = self.config.rope_theta ** (
            -torch.arange(half, dtype=torch.float32, device=x.device) / half
        )
        angles = positions.to(device=x.device, dtype=torch.float32)[:, None] * freqs[None, :]
        cos, sin = angles.cos()[:, None, :], angles.sin()[:, None, :]
        x1, x2 = x[..., :half].float(), x[..., half:].float()
        return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).to(x.dtype)

    def step(
        self,
        tokens: torch.Tensor,
        positions: torch.Tensor,
        cache: torch.Tensor,
        layout: KVLayout,
        block_tables: torch.Tensor,
    ) -> torch.Tensor:
        """One decode step. ``tokens``, ``positions``: ``(B,)`` (position =
        tokens already cached); ``block_tables``: ``(B, max_blocks)``.
        Returns fp32 logits ``(B, vocab)``."""
        c = self.config
        batch = tokens.shape[0]
        pos = positions.to(torch.long)
        tables = block_tables.to(device=cache.device, dtype=torch.long)
        rows = torch.arange(batch, device=cache.device)
        slot_block = tables[rows, pos.to(cache.device) // c.block_size]
        slot_offset = pos.to(cache.device) % c.block_size
        seq_lens = pos + 1
        x = self.embed[tokens.to(self.device)]
        for i, lw in enumerate(self.layers):
            h = self._rms(x, lw.attn_norm)
            q = self.gemm(h, lw.wq).view(batch, c.num_heads, c.head_dim)
            k = self.gemm(h, lw.wk).view(batch, c.num_kv_heads, c.head_dim)
            v = self.gemm(h, lw.wv).view(batch, c.num_kv_heads, c.head_dim)
            q, k = self._rope(q, pos), self._rope(k, pos)
            keys, values = layer_kv(cache, layout, i)
            keys[slot_block, slot_offset] = k.to(device=cache.device, dtype=cache.dtype)
            values[slot_block, slot_offset] = v.to(device=cache.device, dtype=cache.dtype)
            attn = paged_attention(q, cache, layout, i, tables, seq_lens)
            x = x + self.gemm(attn.reshape(batch, -1), lw.wo)
            h = self._rms(x, lw.mlp_norm)
            gate = torch.nn.functional.silu(self.gemm(h, lw.w_gate).float()).to(h.dtype)
            x = x + self.gemm(gate * self.gemm(h, lw.w_up), lw.w_down)
        return self.gemm(self._rms(x, self.final_norm), self.lm_head).float()
