"""Reference paged decode attention over a KV cache in either layout.

It reads a layer through ``layout.layer_kv`` (strided views) and gathers each
request's blocks by its block table, so both layouts feed identical values
into identical arithmetic: the outputs are bitwise equal. GQA: query head
``h`` reads KV head ``h // (H_q / H_kv)``. Accumulation is in fp32.
"""

from __future__ import annotations

import math

import torch

from .layout import KVLayout, layer_kv


def paged_attention(  # noqa: PLR0917
    q: torch.Tensor,
    cache: torch.Tensor,
    layout: KVLayout,
    layer: int,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    *,
    scale: float | None = None,
) -> torch.Tensor:
    """``q``: ``(B, H_q, D)``, one new token per request; ``block_tables``:
    ``(B, max_blocks)`` physical block ids; ``seq_lens``: ``(B,)`` tokens in
    the cache (the new one included). Returns ``(B, H_q, D)`` in q's dtype."""
    keys, values = layer_kv(cache, layout, layer)
    block_size, kv_heads, head_dim = keys.shape[1:]
    batch, q_heads, q_dim = q.shape
    if q_dim != head_dim or q_heads % kv_heads:
        raise ValueError(f"q heads {q_heads}x{q_dim} do not fit KV heads {kv_heads}x{head_dim}")
    group = q_heads // kv_heads
    scale = 1.0 / math.sqrt(head_dim) if scale is None else scale
    out = torch.empty_like(q)
    tables = block_tables.to(device=keys.device, dtype=torch.long)
    for b in range(batch):
        n = int(seq_lens[b])
        ids = tables[b, : -(-n // block_size)]
        k = keys.index_select(0, ids).reshape(-1, kv_heads, head_dim)[:n].float()
        v = values.index_select(0, ids).reshape(-1, kv_heads, head_dim)[:n].float()
        k = k.repeat_interleave(group, dim=1)
        v = v.repeat_interleave(group, dim=1)
        scores = torch.einsum("hd,thd->ht", q[b].float(), k) * scale
        probs = torch.softmax(scores, dim=-1)
        out[b] = torch.einsum("ht,thd->hd", probs, v).to(q.dtype)
    return out
