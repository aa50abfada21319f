"""On a CUDA device (marker ``gpu``; skipped elsewhere): the GPU-only paths
against their references: Triton on page-locked host memory, the
cudaMemcpyBatchAsync path, two-stream duplex with events, HybridGEMM with W
in host-mapped memory, and the end-to-end harness on the GPU.

    .venv/bin/python -m pytest -q -m gpu tests/kernels
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from planner.kernels.duplex import DuplexEngine, Method  # noqa: E402
from planner.kernels.extents import make_batch  # noqa: E402
from planner.kernels.harness import RotationEvent, run_decode  # noqa: E402
from planner.kernels.hybrid_gemm import Tiles, hybrid_gemm_reference  # noqa: E402
from planner.kernels.layout import KVLayout, KVShape, allocate  # noqa: E402
from planner.kernels.pack import gather_reference, pack_layout, scatter_reference  # noqa: E402
from planner.kernels.tiny_model import TinyConfig, TinyTransformer  # noqa: E402
from planner.kernels.transfer_batch import CopyDirection  # noqa: E402
from planner.kernels.transfer_memcpy import (  # noqa: E402
    memcpy_batch_available,
    run_batch_memcpy,
)
from planner.kernels.transfer_ref import run_batch_reference  # noqa: E402

pytestmark = pytest.mark.gpu

SHAPE = KVShape(4, 0, 16, 2, 64)


def _pools(n_gpu=64, n_cpu=64):
    gpu = allocate(
        SHAPE.with_blocks(n_gpu), KVLayout.BLOCK_FIRST, dtype=torch.bfloat16, device="cuda"
    )
    gpu.uniform_(-1, 1)
    cpu = allocate(SHAPE.with_blocks(n_cpu), KVLayout.BLOCK_FIRST, dtype=torch.bfloat16, pin=True)
    cpu.uniform_(-1, 1)
    assert cpu.is_pinned()
    return gpu, cpu


def _methods():
    out = [Method.REFERENCE, Method.TRITON, Method.PER_EXTENT, Method.PER_BLOCK]
    if memcpy_batch_available():
        out.append(Method.MEMCPY_BATCH)
    return out


@pytest.mark.parametrize("method", _methods())
@pytest.mark.parametrize("duplex", [True, False])
def test_duplex_on_two_streams(method, duplex):
    gpu, cpu = _pools()
    d2h = make_batch(CopyDirection.D2H, [(0, 5), (1, 6), (2, 7), (9, 40), (33, 0)])
    h2d = make_batch(CopyDirection.H2D, [(10, 50), (11, 51), (20, 3), (63, 60)])
    want_gpu, want_cpu = gpu.clone(), cpu.clone()
    run_batch_reference(want_gpu, want_cpu, d2h)
    run_batch_reference(want_cpu, want_gpu, h2d)
    handle = DuplexEngine(gpu, cpu, method=method, duplex=duplex).submit([d2h, h2d])
    handle.wait(torch.cuda.current_stream())
    handle.wait()
    assert handle.query()
    assert torch.equal(gpu, want_gpu) and torch.equal(cpu, want_cpu)


def test_memcpy_batch_on_the_default_stream():
    if not memcpy_batch_available():
        pytest.skip("cudaMemcpyBatchAsync needs cuda-python and CUDA >= 12.8")
    gpu, cpu = _pools()
    batch = make_batch(CopyDirection.H2D, [(1, 2), (2, 3), (30, 8)])
    want = gpu.clone()
    run_batch_reference(cpu, want, batch)
    run_batch_memcpy(cpu, gpu, batch)
    torch.cuda.synchronize()
    assert torch.equal(gpu, want)


@pytest.mark.parametrize("rho", [0.0, 0.3, 1.0])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_hybrid_gemm_with_host_mapped_weights(rho, dtype):
    from planner.kernels.triton_gemm import hybrid_gemm  # noqa: PLC0415 - triton is optional

    x = torch.randn(100, 512, device="cuda").to(dtype)
    w = (torch.randn(512, 384, device="cuda") / 20).to(dtype)
    ref = hybrid_gemm_reference(x, w)
    for home in (w, w.cpu().pin_memory()):
        y = hybrid_gemm(x, home, rho, tiles=Tiles(64, 64, 64))
        assert torch.allclose(y.float(), ref.float(), atol=2e-2, rtol=2e-2)


def test_pack_gather_on_gpu():
    from planner.kernels.triton_pack import gather, scatter  # noqa: PLC0415 - triton is optional

    ts = [torch.randn(n, device="cuda") for n in (7, 4096, 100_000)]
    layout = pack_layout(ts, align=16)
    a = torch.full((layout.total,), float("nan"), device="cuda")
    b = a.clone()
    gather(ts, a, layout)
    gather_reference(ts, b, layout)
    assert torch.equal(a.nan_to_num(0), b.nan_to_num(0))
    outs = [torch.empty_like(t) for t in ts]
    scatter(a, outs, layout)
    back = [torch.empty_like(t) for t in ts]
    scatter_reference(b, back, layout)
    assert all(torch.equal(x, y) for x, y in zip(outs, back, strict=True))


@pytest.mark.parametrize("method", _methods())
def test_e2e_rotation_on_gpu(method):
    model = TinyTransformer(TinyConfig(), seed=0, device="cuda")
    prompts = {"a": [1, 2, 3, 4, 5], "b": [7, 8], "c": [9, 10, 11, 12, 13, 14]}
    events = [
        RotationEvent(3, swap_out=("a",)),
        RotationEvent(6, swap_out=("c",), swap_in=("a",)),
        RotationEvent(9, swap_in=("c",)),
    ]
    base = run_decode(model, prompts, 12, events, rotate=False)
    rot = run_decode(model, prompts, 12, events, method=method, gpu_blocks=16)
    assert rot.tokens == base.tokens
    for r in prompts:
        assert torch.equal(torch.stack(rot.logits[r]), torch.stack(base.logits[r]))
