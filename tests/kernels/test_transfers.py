"""Block transfers of a rotation plan's batches: every method against the
index_copy_ reference, on poisoned destinations, ragged extents included."""

from __future__ import annotations

import ctypes
import random
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")

from planner.kernels import transfer_memcpy  # noqa: E402
from planner.kernels.duplex import DuplexEngine, Method  # noqa: E402
from planner.kernels.extents import (  # noqa: E402
    RaceError,
    block_copies,
    by_direction,
    check_race_free,
    make_batch,
)
from planner.kernels.layout import KVLayout, KVShape, to_block_first, to_layer_first  # noqa: E402
from planner.kernels.transfer_batch import BlockExtent, CopyDirection, TransferBatch  # noqa: E402
from planner.kernels.transfer_memcpy import batch_spans, memcpy_batch_available  # noqa: E402
from planner.kernels.transfer_naive import (  # noqa: E402
    copy_per_block,
    copy_per_extent,
    copy_per_segment,
)
from planner.kernels.transfer_ref import run_batch_reference  # noqa: E402
from planner.kernels.triton_blocks import copy_blocks_triton, run_batch_triton  # noqa: E402
from planner.kernels.triton_support import interpreting  # noqa: E402

from planner.domain.requests import (  # noqa: E402
    NO_BLOCK,
    BlockPools,
    RequestState,
    RequestTable,
    Snapshot,
    TrackedRequest,
)
from planner.domain.rotation import MoveKind, RotationInputs, RotationParams, RotationVariant  # noqa: E402
from planner.policies.duplexkv import merge_extents  # noqa: E402
from planner.policies.rotation import plan_rotation  # noqa: E402

# Triton on CPU tensors runs only under its interpreter (conftest sets it where
# there is no CUDA device); on a GPU machine these cases are test_gpu's.
CPU_TRITON = pytest.mark.skipif(not interpreting(), reason="needs TRITON_INTERPRET=1")

NAN = float("nan")
SHAPES = [KVShape(1, 0, 1, 1, 1), KVShape(3, 0, 4, 2, 8), KVShape(2, 0, 16, 1, 3)]
DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def _pairs(rng: random.Random, n_src: int, n_dst: int, count: int) -> list[tuple[int, int]]:
    """Random distinct (src, dst) pairs with some consecutive runs (ragged
    extents of 1..several blocks)."""
    src = rng.sample(range(n_src), count)
    dst = rng.sample(range(n_dst), count)
    if count > 3:  # a run consecutive on both sides
        src[:3] = sorted(src[:3])
        base_s, base_d = min(n_src - 3, src[0]), min(n_dst - 3, dst[0])
        pairs = {(base_s + i, base_d + i) for i in range(3)}
        used_s = {p[0] for p in pairs}
        used_d = {p[1] for p in pairs}
        for s, d in zip(src[3:], dst[3:], strict=True):
            if s not in used_s and d not in used_d:
                pairs.add((s, d))
                used_s.add(s)
                used_d.add(d)
        return sorted(pairs)
    return list(zip(src, dst, strict=True))


def _poisoned_pair(shape: KVShape, n_src: int, n_dst: int, dtype, gen):
    src = torch.randn(shape.with_blocks(n_src).dims(KVLayout.BLOCK_FIRST), generator=gen).to(dtype)
    dst = torch.full(shape.with_blocks(n_dst).dims(KVLayout.BLOCK_FIRST), NAN, dtype=dtype)
    return src, dst


def _same(a, b):
    return torch.equal(a.nan_to_num(1234.0), b.nan_to_num(1234.0))


def test_make_batch_matches_the_policys_merge():
    rng = random.Random(0)
    for _ in range(50):
        pairs = _pairs(rng, 40, 40, rng.randint(1, 20))
        batch = make_batch(CopyDirection.D2H, pairs, 7)
        assert batch.extents == merge_extents(list(pairs))
        assert batch.num_blocks == len(pairs) and batch.num_bytes == 7 * len(pairs)
        copies = block_copies(batch)
        assert sorted(zip(copies.src.tolist(), copies.dst.tolist(), strict=True)) == sorted(pairs)


MOVERS = {
    "per_extent": copy_per_extent,
    "per_block": copy_per_block,
    "triton": run_batch_triton,
}


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "mover", [pytest.param(m, marks=CPU_TRITON) if m == "triton" else m for m in sorted(MOVERS)]
)
def test_block_copies_match_reference(shape, dtype, mover):
    rng = random.Random(hash((shape, str(dtype), mover)) & 0xFFFF)
    gen = torch.Generator().manual_seed(rng.randint(0, 1 << 30))
    for n_src, n_dst, count in [(9, 12, 1), (16, 10, 7), (20, 20, 20)]:
        src, dst = _poisoned_pair(shape, n_src, n_dst, dtype, gen)
        batch = make_batch(CopyDirection.H2D, _pairs(rng, n_src, n_dst, count))
        want = dst.clone()
        run_batch_reference(src, want, batch)
        MOVERS[mover](src, dst, batch)
        assert _same(dst, want)
        copies = block_copies(batch)
        untouched = sorted(set(range(n_dst)) - set(copies.dst.tolist()))
        assert dst[untouched].isnan().all()
        assert not dst[copies.dst].isnan().any()


@pytest.mark.parametrize("layout", list(KVLayout))
def test_per_segment_baseline_in_both_layouts(layout):
    gen = torch.Generator().manual_seed(1)
    shape = KVShape(3, 0, 4, 2, 8)
    src_bf, dst_bf = _poisoned_pair(shape, 10, 8, torch.float32, gen)
    batch = make_batch(CopyDirection.D2H, [(0, 7), (1, 0), (2, 1), (9, 4)])
    want = dst_bf.clone()
    run_batch_reference(src_bf, want, batch)
    if layout is KVLayout.LAYER_FIRST:
        src, dst = to_layer_first(src_bf), to_layer_first(dst_bf)
    else:
        src, dst = src_bf, dst_bf
    calls = copy_per_segment(src, dst, layout, batch)
    assert calls == 4 * 3 * 2
    got = to_block_first(dst) if layout is KVLayout.LAYER_FIRST else dst
    assert _same(got, want)


def test_memcpy_spans_address_the_right_bytes():
    """The byte spans handed to cudaMemcpyBatchAsync, replayed with memmove
    on CPU: one span per extent, and the same result as the reference."""
    gen = torch.Generator().manual_seed(2)
    shape = KVShape(2, 0, 4, 2, 4)
    src, dst = _poisoned_pair(shape, 12, 12, torch.bfloat16, gen)
    batch = make_batch(CopyDirection.D2H, [(0, 5), (1, 6), (2, 7), (9, 0), (11, 3)])
    spans = batch_spans(src, dst, batch)
    assert len(spans.sizes) == len(batch.extents) == 3
    assert spans.num_bytes == 5 * shape.block_elems * 2
    want = dst.clone()
    run_batch_reference(src, want, batch)
    for d, s, n in zip(spans.dsts, spans.srcs, spans.sizes, strict=True):
        ctypes.memmove(d, s, n)
    assert _same(dst, want)
    assert not memcpy_batch_available()  # no CUDA here


def test_bounds_and_shape_errors():
    src = torch.zeros(KVShape(1, 4, 2, 1, 2).dims(KVLayout.BLOCK_FIRST))
    dst = torch.zeros(KVShape(1, 4, 2, 1, 2).dims(KVLayout.BLOCK_FIRST))
    out_of_range = TransferBatch(CopyDirection.D2H, (BlockExtent(3, 0, 2),), 2, 0)
    for fn in (run_batch_reference, run_batch_triton, copy_per_extent, copy_per_block):
        with pytest.raises(IndexError):
            fn(src, dst, out_of_range)
    with pytest.raises(ValueError):
        run_batch_reference(
            src, torch.zeros(4, 1, 2, 2, 1, 3), make_batch(CopyDirection.D2H, [(0, 0)])
        )


def test_race_check_and_direction_grouping():
    d2h = make_batch(CopyDirection.D2H, [(4, 0), (5, 1)])
    ok = make_batch(CopyDirection.H2D, [(7, 6)])
    bad = make_batch(CopyDirection.H2D, [(7, 5)])
    check_race_free(d2h, ok)
    with pytest.raises(RaceError):
        check_race_free(d2h, bad)
    extra = make_batch(CopyDirection.D2H, [(9, 9)])
    joined, h2d = by_direction([d2h, ok, extra])
    assert h2d is ok and joined is not None
    assert joined.num_blocks == 3 and len(joined.extents) == 2


@pytest.mark.parametrize(
    "method", [Method.REFERENCE, pytest.param(Method.TRITON, marks=CPU_TRITON), Method.PER_EXTENT]
)
@pytest.mark.parametrize("duplex", [True, False])
def test_duplex_engine_runs_both_directions(method, duplex):
    gen = torch.Generator().manual_seed(3)
    shape = KVShape(2, 0, 4, 1, 4)
    gpu = torch.randn(shape.with_blocks(10).dims(KVLayout.BLOCK_FIRST), generator=gen)
    cpu = torch.randn(shape.with_blocks(10).dims(KVLayout.BLOCK_FIRST), generator=gen)
    d2h = make_batch(CopyDirection.D2H, [(0, 3), (1, 4), (6, 9)])
    h2d = make_batch(CopyDirection.H2D, [(0, 2), (1, 3), (5, 8)])
    want_gpu, want_cpu = gpu.clone(), cpu.clone()
    run_batch_reference(want_gpu, want_cpu, d2h)
    run_batch_reference(want_cpu, want_gpu, h2d)
    engine = DuplexEngine(gpu, cpu, method=method, duplex=duplex)
    handle = engine.submit([h2d, d2h])
    assert handle.query()
    handle.wait()
    assert torch.equal(gpu, want_gpu) and torch.equal(cpu, want_cpu)
    with pytest.raises(RaceError):
        engine.submit([d2h, make_batch(CopyDirection.H2D, [(7, 6)])])
    assert engine.submit([]).query()


def test_duplex_engine_rejects_mismatched_pools():
    a = torch.zeros(KVShape(1, 3, 2, 1, 2).dims(KVLayout.BLOCK_FIRST))
    with pytest.raises(ValueError):
        DuplexEngine(a, torch.zeros(3, 1, 2, 2, 1, 4))
    assert DuplexEngine(a, a.clone()).method is Method.REFERENCE


@pytest.mark.parametrize(
    "method", [Method.REFERENCE, pytest.param(Method.TRITON, marks=CPU_TRITON)]
)
def test_executes_a_plan_from_the_rotation_policy(method):
    """The policy's block-level plan (preempt one request, swap another in
    partly into the blocks just released, eager copies) carried out: every
    move of the plan lands the source block's data on its destination."""
    requests = [
        TrackedRequest(
            "old",
            RequestState.RUNNING,
            run_start_s=0.0,
            gpu_block_ids=(10, 11, 12, 13),
            num_tokens=60,
            cpu_block_ids=(100, 101, NO_BLOCK),
        ),
        TrackedRequest(
            "new", RequestState.RUNNING, run_start_s=5.0, gpu_block_ids=(20, 21, 22), num_tokens=48
        ),
        TrackedRequest(
            "rot", RequestState.ROTARY, last_token_s=8.0, cpu_block_ids=(200, 201, 202, 203)
        ),
    ]
    pools = BlockPools(free_gpu_block_ids=(31, 30), free_cpu_block_ids=tuple(range(309, 299, -1)))
    snapshot = Snapshot(
        now_s=10.0,
        free_gpu_blocks=2,
        requests=RequestTable.from_requests(requests, 16, block_level=True),
        block_size_tokens=16,
        pools=pools,
    )
    # The paper's variant: "old" holds no token count, so LVF would not
    # preempt it; Algorithm 1 does.
    paper = RotationParams(transfer_budget_blocks=4, variant=RotationVariant.LVF_PAPER)
    plan = plan_rotation(snapshot, RotationInputs(params=paper))
    assert {m.kind for m in plan.moves} == {MoveKind.SWAP_OUT, MoveKind.SWAP_IN, MoveKind.EAGER}
    assert plan.batches
    shape = KVShape(2, 0, 4, 2, 4)
    gen = torch.Generator().manual_seed(4)
    gpu = torch.randn(shape.with_blocks(32).dims(KVLayout.BLOCK_FIRST), generator=gen)
    cpu = torch.randn(shape.with_blocks(310).dims(KVLayout.BLOCK_FIRST), generator=gen)
    gpu[list(plan.released_gpu_block_ids)] = NAN  # released: contents are garbage
    before_gpu, before_cpu = gpu.clone(), cpu.clone()
    DuplexEngine(gpu, cpu, method=method).submit_plan(plan).wait()
    for move in plan.moves:
        for s, d in zip(move.src_block_ids, move.dst_block_ids, strict=True):
            if move.kind is MoveKind.SWAP_IN:
                assert torch.equal(gpu[d], before_cpu[s])
            else:
                assert torch.equal(cpu[d], before_gpu[s])


def _fake_runtime(result):
    """cuda.bindings.runtime's surface used by the batched copy: records the
    call and answers as cuda-bindings 12.x ``(err, failIdx)`` or 13.x ``(err,)``."""
    calls = []

    def batch(*args):
        calls.append(args)
        return rt.result

    rt = SimpleNamespace(
        result=result,
        calls=calls,
        cudaError_t=SimpleNamespace(cudaSuccess=0),
        cudaMemcpySrcAccessOrder=SimpleNamespace(cudaMemcpySrcAccessOrderStream=1),
        cudaMemcpyFlags=SimpleNamespace(cudaMemcpyFlagPreferOverlapWithCompute=1),
        cudaMemcpyAttributes=lambda: SimpleNamespace(srcAccessOrder=0, flags=0),
        cudaStream_t=lambda handle: ("stream", handle),
        cudaMemcpyBatchAsync=batch,
    )
    return rt


class _Stream:
    cuda_stream = 77


@pytest.mark.parametrize("result", [(0,), (0, None)])
def test_memcpy_batch_call_shape_for_cuda_12_and_13(monkeypatch, result):
    fake = _fake_runtime(result)
    monkeypatch.setattr(transfer_memcpy, "_runtime", lambda: fake)
    spans = transfer_memcpy.Spans((100, 200), (300, 400), (8, 16))
    transfer_memcpy.memcpy_batch_async(spans, _Stream())
    ((dsts, srcs, sizes, count, attrs, idxs, num_attrs, stream),) = fake.calls
    assert (dsts, srcs, sizes, count) == ([100, 200], [300, 400], [8, 16], 2)
    assert len(attrs) == 1 and attrs[0].srcAccessOrder == 1
    assert (idxs, num_attrs, stream) == ([0], 1, ("stream", 77))
    fake.result = (1, 1) if len(result) == 2 else (1,)
    with pytest.raises(RuntimeError, match="cudaMemcpyBatchAsync failed"):
        transfer_memcpy.memcpy_batch_async(spans, _Stream())
    transfer_memcpy.memcpy_batch_async(transfer_memcpy.Spans((), (), ()), _Stream())
    assert len(fake.calls) == 2  # an empty batch makes no call


@CPU_TRITON
@pytest.mark.parametrize(("programs", "chunk"), [(1, 16), (3, 16), (5, 8), (64, 32)])
def test_triton_persistent_grid_copies_every_chunk_once(programs, chunk):
    """Fewer programs than items: each walks its share; more: the spare ones
    idle. Blocks of 40 elements in chunks that do not divide them."""
    gen = torch.Generator().manual_seed(programs)
    src = torch.randn(9, 40, generator=gen)
    dst = torch.zeros(7, 40)
    ids_src = torch.tensor([8, 0, 3, 5])
    ids_dst = torch.tensor([1, 6, 0, 2])
    copy_blocks_triton(src, dst, ids_src, ids_dst, chunk=chunk, programs=programs)
    want = torch.zeros(7, 40)
    want[ids_dst] = src[ids_src]
    assert torch.equal(dst, want)
