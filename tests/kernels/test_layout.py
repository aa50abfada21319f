"""Layer-first <-> block-first conversion and paged attention over either layout."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from planner.kernels.layout import (  # noqa: E402
    KVLayout,
    KVShape,
    allocate,
    layer_kv,
    shape_of,
    to_block_first,
    to_layer_first,
)
from planner.kernels.paged_attention import paged_attention  # noqa: E402

SHAPES = [KVShape(1, 1, 1, 1, 1), KVShape(3, 7, 4, 2, 8), KVShape(5, 9, 16, 1, 4)]


@pytest.mark.parametrize("shape", SHAPES)
def test_round_trip_and_views(shape):
    lf = torch.randn(shape.dims(KVLayout.LAYER_FIRST))
    bf = to_block_first(lf)
    assert bf.shape == shape.dims(KVLayout.BLOCK_FIRST) and bf.is_contiguous()
    assert shape_of(bf, KVLayout.BLOCK_FIRST) == shape == shape_of(lf, KVLayout.LAYER_FIRST)
    assert torch.equal(to_layer_first(bf), lf)
    for layer in range(shape.num_layers):
        k_lf, v_lf = layer_kv(lf, KVLayout.LAYER_FIRST, layer)
        k_bf, v_bf = layer_kv(bf, KVLayout.BLOCK_FIRST, layer)
        assert torch.equal(k_lf, k_bf) and torch.equal(v_lf, v_bf)
        # A view, not a copy: the block stride spans every layer's K and V.
        assert k_bf.data_ptr() == bf[0, layer, 0].data_ptr()
        if shape.num_blocks > 1:  # (a size-1 dimension's stride is arbitrary)
            assert k_bf.stride(0) == shape.block_elems
            assert k_lf.stride(0) == shape.segment_elems
    # One block of a block-first cache is one contiguous region.
    assert bf[min(2, shape.num_blocks - 1)].is_contiguous()
    assert bf[0].numel() == shape.block_elems


def test_allocate_poisons_and_checks():
    cache = allocate(KVShape(2, 3, 4, 1, 2), KVLayout.BLOCK_FIRST, fill=float("nan"))
    assert cache.isnan().all()
    with pytest.raises(ValueError):
        shape_of(torch.zeros(2, 3, 4), KVLayout.BLOCK_FIRST)
    with pytest.raises(ValueError):
        shape_of(torch.zeros(2, 3, 3, 4, 1, 2), KVLayout.BLOCK_FIRST)


def _dense_attention(q, keys, values, scale):
    """Plain attention over contiguous K/V ``(T, H_kv, D)`` with GQA."""
    group = q.shape[0] // keys.shape[1]
    k = keys.repeat_interleave(group, dim=1).double()
    v = values.repeat_interleave(group, dim=1).double()
    p = torch.softmax(torch.einsum("hd,thd->ht", q.double(), k) * scale, -1)
    return torch.einsum("ht,thd->hd", p, v)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("heads", "kv_heads"), [(4, 2), (6, 1), (2, 2)])
def test_paged_attention_same_in_both_layouts(dtype, heads, kv_heads):
    gen = torch.Generator().manual_seed(heads * 10 + kv_heads)
    shape = KVShape(3, 24, 4, kv_heads, 8)
    bf = torch.randn(shape.dims(KVLayout.BLOCK_FIRST), generator=gen).to(dtype)
    lf = to_layer_first(bf)
    seq_lens = torch.tensor([1, 4, 5, 13, 16])
    width = max(-(-int(n) // 4) for n in seq_lens)
    perm = torch.randperm(24, generator=gen)
    tables = perm[: len(seq_lens) * width].view(len(seq_lens), width)
    q = torch.randn(len(seq_lens), heads, 8, generator=gen).to(dtype)
    for layer in range(3):
        a = paged_attention(q, bf, KVLayout.BLOCK_FIRST, layer, tables, seq_lens)
        b = paged_attention(q, lf, KVLayout.LAYER_FIRST, layer, tables, seq_lens)
        assert torch.equal(a, b)
        keys, values = layer_kv(lf, KVLayout.LAYER_FIRST, layer)
        for i, n in enumerate(seq_lens.tolist()):
            ids = tables[i, : -(-n // 4)]
            k = keys[ids].reshape(-1, kv_heads, 8)[:n]
            v = values[ids].reshape(-1, kv_heads, 8)[:n]
            want = _dense_attention(q[i], k, v, 1 / math.sqrt(8))
            tol = 1e-5 if dtype == torch.float32 else 2e-2
            assert torch.allclose(a[i].double(), want, atol=tol, rtol=tol)


def test_paged_attention_rejects_mismatched_heads():
    cache = torch.zeros(KVShape(1, 2, 4, 3, 8).dims(KVLayout.BLOCK_FIRST))
    with pytest.raises(ValueError):
        paged_attention(
            torch.zeros(1, 4, 8), cache, KVLayout.BLOCK_FIRST, 0, torch.zeros(1, 1), torch.ones(1)
        )
