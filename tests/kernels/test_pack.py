"""AQUA's gather/scatter: many small tensors into one buffer and back."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from planner.kernels.triton_support import interpreting  # noqa: E402

# Triton on CPU tensors: only under its interpreter (see conftest); on a GPU
# machine test_gpu covers these kernels.
pytestmark = pytest.mark.skipif(not interpreting(), reason="needs TRITON_INTERPRET=1")

from planner.kernels.pack import (  # noqa: E402
    gather_reference,
    pack_layout,
    scatter_reference,
)
from planner.kernels.triton_pack import gather, scatter  # noqa: E402

CASES = [(1,), (5, 1, 3), (1000, 17, 1025, 2, 64), (4096, 4097)]


@pytest.mark.parametrize("sizes", CASES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int8])
@pytest.mark.parametrize("align", [1, 8])
def test_gather_and_scatter_match_reference(sizes, dtype, align):
    gen = torch.Generator().manual_seed(sum(sizes) + align)
    tensors = [(torch.randn(n, generator=gen) * 50).to(dtype) for n in sizes]
    tensors[0] = tensors[0].view(-1, 1) if sizes[0] > 1 else tensors[0]  # any shape
    layout = pack_layout(tensors, align=align)
    assert all(o % align == 0 for o in layout.offsets)
    poison = 77 if dtype == torch.int8 else float("nan")
    got = torch.full((layout.total + 3,), poison, dtype=dtype)
    want = got.clone()
    gather(tensors, got, layout)
    gather_reference(tensors, want, layout)
    assert torch.equal(got.view(torch.uint8), want.view(torch.uint8))
    outs = [torch.full_like(t, poison) for t in tensors]
    scatter(got, outs, layout)
    for out, t in zip(outs, tensors, strict=True):
        assert torch.equal(out, t)
    back = [torch.empty_like(t) for t in tensors]
    scatter_reference(want, back, layout)
    assert all(torch.equal(a, b) for a, b in zip(back, tensors, strict=True))


def test_layout_and_checks():
    ts = [torch.zeros(3), torch.zeros(5)]
    layout = pack_layout(ts, align=4)
    assert layout.offsets == (0, 4) and layout.total == 9
    assert pack_layout([]).total == 0
    with pytest.raises(ValueError):
        gather(ts, torch.zeros(8), layout)  # too small
    with pytest.raises(ValueError):
        gather(ts, torch.zeros(9, dtype=torch.float16), layout)  # dtype
    with pytest.raises(ValueError):
        gather([torch.zeros(4, 2).t()], torch.zeros(8), pack_layout([torch.zeros(8)]))
    gather([], torch.zeros(1), pack_layout([]))
    empty = [torch.zeros(0), torch.zeros(0)]
    gather(empty, torch.zeros(1), pack_layout(empty))
    mixed = [torch.zeros(0), torch.arange(3.0)]
    buf = torch.full((3,), float("nan"))
    gather(mixed, buf, pack_layout(mixed))
    assert torch.equal(buf, torch.arange(3.0))
