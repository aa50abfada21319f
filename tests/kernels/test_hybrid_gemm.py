"""HybridGEMM: every rho gives X·W (fp32 accumulate), on ragged shapes."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from planner.kernels.triton_support import interpreting  # noqa: E402

# Triton on CPU tensors: only under its interpreter (see conftest); on a GPU
# machine test_gpu covers these kernels.
pytestmark = pytest.mark.skipif(not interpreting(), reason="needs TRITON_INTERPRET=1")

from planner.kernels.hybrid_gemm import Tiles, hybrid_gemm_reference, split_columns  # noqa: E402
from planner.kernels.triton_gemm import hybrid_gemm  # noqa: E402

SHAPES = [(1, 1, 1), (17, 33, 50), (40, 16, 16), (5, 70, 97)]
RHOS = [0.0, 0.3, 1.0]
TOL = {torch.float32: 1e-5, torch.float16: 1e-3, torch.bfloat16: 8e-3}


@pytest.mark.parametrize(("m", "k", "n"), SHAPES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_every_rho_matches_the_reference(m, k, n, dtype):
    gen = torch.Generator().manual_seed(m * 1000 + k * 10 + n)
    x = torch.randn(m, k, generator=gen).to(dtype)
    w = torch.randn(k, n, generator=gen).to(dtype)
    ref = hybrid_gemm_reference(x, w)
    exact = (x.double() @ w.double()).float()
    outs = []
    for rho in RHOS:
        out = torch.full((m, n), float("nan"), dtype=dtype)
        y = hybrid_gemm(x, w, rho, tiles=Tiles(16, 16, 16), out=out)
        assert y is out and not y.isnan().any()
        scale = exact.abs().max().item() + 1
        assert (y.float() - ref.float()).abs().max().item() <= TOL[dtype] * scale
        assert (y.float() - exact).abs().max().item() <= TOL[dtype] * scale
        outs.append(y)
        assert torch.allclose(
            hybrid_gemm_reference(x, w, rho, block_k=16).float(),
            ref.float(),
            atol=TOL[dtype] * scale,
        )
    # Same K tiles, same fp32 additions: the split does not change a bit.
    for y in outs[1:]:
        assert torch.equal(y, outs[0])


def test_tile_sizes_do_not_matter_beyond_rounding():
    gen = torch.Generator().manual_seed(9)
    x = torch.randn(33, 64, generator=gen).to(torch.bfloat16)
    w = torch.randn(64, 48, generator=gen).to(torch.bfloat16)
    a = hybrid_gemm(x, w, 0.5, tiles=Tiles(16, 32, 32))
    b = hybrid_gemm(x, w, 0.5, tiles=Tiles(32, 16, 16))
    assert torch.allclose(a.float(), b.float(), atol=0.1)


def test_split_and_checks():
    assert [split_columns(10, r) for r in (0.0, 0.3, 1.0)] == [0, 3, 10]
    with pytest.raises(ValueError):
        split_columns(10, 1.5)
    with pytest.raises(ValueError):
        hybrid_gemm(torch.zeros(2, 3), torch.zeros(4, 5), 0.5)
    with pytest.raises(ValueError):
        hybrid_gemm(torch.zeros(2, 3), torch.zeros(3, 5, dtype=torch.float16), 0.5)


def test_a_larger_weight_stationary_k_tile_agrees_to_rounding():
    """The weight-stationary part with its own (larger) K tile: the same
    product up to fp32 summation order, for every split."""
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(33, 80, generator=gen)
    w = torch.randn(80, 40, generator=gen)
    exact = (x.double() @ w.double()).float()
    for rho in (0.0, 0.5):
        y = hybrid_gemm(x, w, rho, tiles=Tiles(16, 16, 16), ws_tiles=Tiles(16, 16, 64))
        assert torch.allclose(y, exact, atol=1e-4)
