"""AQUA's CFS in the single-engine replay: token times worked out by hand on a
tiny trace (a partition that pages a long decode out for newcomers and back
in when they finish), invariants on random traces (every request finishes
once with its tokens, GPU blocks within the pool, paged-out KV back before
it is used), a faster paging link never slower, and the paging targets."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planner.domain.requests import Slo
from planner.domain.rotation import RotationInputs
from planner.profiles import find_hardware
from planner.profiles.link import PCIE_GEN5_X16
from planner.replay.batching_core import BatchingCore
from planner.replay.cfs_paging import Paging, paging_target, peer_link
from planner.replay.cfs_scheduler import Cfs, CfsKnobs
from planner.replay.engine import Engine, EngineConfig
from planner.replay.prefix_cache import PrefixCache
from planner.replay.records import ReplayResult
from planner.replay.scheduler_by_name import make_scheduler
from planner.replay.schedulers import EngineView, Fcfs
from planner.replay.state import Phase, RequestColumns
from planner.trace.records import TraceRequest

BLOCK_BYTES = 1000


class AffineCost:
    """10 ms per iteration + 1 ms per prefill token + 2 ms per decode token."""

    def iteration_time_s(
        self, prefill_tokens: int, decode_tokens: int, attended_context_tokens: int
    ) -> float:
        return 0.01 + 0.001 * prefill_tokens + 0.002 * decode_tokens


class Link:
    """(d2h + h2d) bytes / bandwidth."""

    def __init__(self, bytes_per_s: float) -> None:
        self.bytes_per_s = bytes_per_s

    def transfer_time_s(self, d2h_bytes: int, h2d_bytes: int, segment_bytes: int) -> float:
        return (d2h_bytes + h2d_bytes) / self.bytes_per_s


class WatchedEngine(Engine):
    """Checks after every iteration: the pools hold, GPU blocks stay within
    the pool, and a request whose KV was paged out when the iteration began
    neither emitted nor grew its KV in it (it runs only once paged back in)."""

    def _iteration(self) -> None:
        r, s, cfg = self.requests, self.state, self.config
        paged_out = r.phase == Phase.ROTARY
        generated, kv = r.generated.copy(), r.kv_tokens.copy()
        super()._iteration()
        assert (r.generated[paged_out] == generated[paged_out]).all()
        assert (r.kv_tokens[paged_out] == kv[paged_out]).all()
        assert s.free_gpu >= 0 and int(r.gpu_blocks.sum()) == cfg.gpu_kv_blocks - s.free_gpu
        assert s.free_cpu >= 0 and int(r.cpu_blocks.sum()) == cfg.cpu_kv_blocks - s.free_cpu
        rotary = r.phase == Phase.ROTARY
        assert (r.cpu_blocks >= -(-r.kv_tokens // cfg.block_size_tokens))[rotary].all()


def req(arrival_s: float, prompt: int, output: int, id: str) -> TraceRequest:
    return TraceRequest(arrival_s=arrival_s, prompt_tokens=prompt, output_tokens=output, id=id)


def config(gpu: int, cpu: int, *, bs: int = 4, budget: int = 64) -> EngineConfig:
    return EngineConfig(
        gpu_kv_blocks=gpu,
        cpu_kv_blocks=cpu,
        block_bytes=BLOCK_BYTES,
        block_size_tokens=bs,
        max_batched_tokens=budget,
    )


def run(
    trace: Sequence[TraceRequest],
    cfg: EngineConfig,
    *,
    every: int = 1,
    bytes_per_s: float = 1e6,
    name: str = "cfs",
) -> tuple[WatchedEngine, Cfs, ReplayResult]:
    scheduler = make_scheduler(name, RotationInputs(), CfsKnobs(cfg.max_batched_tokens, every))
    assert isinstance(scheduler, Cfs)
    engine = WatchedEngine(cfg, scheduler, AffineCost(), Link(bytes_per_s), trace)
    return engine, scheduler, engine.run()


def test_a_long_decode_is_paged_out_for_newcomers_and_back_in_after() -> None:
    # 4 blocks of 4 tokens. A (prompt 4) decodes alone; at 6 tokens its KV
    # takes 3 blocks when B and C (prompt 4, 2 tokens each) arrive.
    trace = [req(0.0, 4, 10, "A"), req(0.07, 4, 2, "B"), req(0.07, 4, 2, "C")]
    engine, cfs, result = run(trace, config(gpu=4, cpu=10), every=1)
    a, b, c = result.requests
    # A: prefill 14 ms, then 12 ms decodes to 0.074.
    # t=0.074: A (KV 9 tokens, 3 blocks with the next one) decodes; the one
    #   block left takes B's 4-token prompt, C's finds none: B joins, 16 ms.
    # t=0.090: B (0 generated beyond its prompt, 2 blocks) is the decode with
    #   the fewest tokens; A's 3 more blocks do not fit beside it: A is paged
    #   out (3 blocks, 3 ms, hidden under the iteration) and C's prompt takes
    #   a block. B decodes and finishes, C prefills: 16 ms.
    # t=0.106: B finished: re-partition; C decodes (A's 3 blocks do not fit
    #   beside its 2): it finishes at 0.118.
    # t=0.118: C finished: A is paged in (3 ms under a 10 ms empty
    #   iteration) and decodes from 0.128 on.
    assert a.token_times_s == pytest.approx(
        [0.014, 0.026, 0.038, 0.050, 0.062, 0.074, 0.090, 0.140, 0.152, 0.164], abs=1e-12
    )
    assert b.token_times_s == pytest.approx([0.090, 0.106], abs=1e-12)
    assert c.token_times_s == pytest.approx([0.106, 0.118], abs=1e-12)
    assert (a.swap_outs, a.swap_ins, b.preemptions, c.preemptions) == (1, 1, 0, 0)
    totals = result.totals
    assert totals.bytes_d2h == totals.bytes_h2d == 3 * BLOCK_BYTES
    assert totals.stall_s == 0.0
    assert engine.state.free_gpu == 4 and engine.state.free_cpu == 10
    assert cfs.partitions == totals.iterations  # k = 1: every iteration


def test_the_partition_holds_for_k_iterations() -> None:
    # k = 4: B arrives at 0.02 while A's partition (made at iteration 0)
    # holds, with room for it; it waits for the re-partition at iteration 4
    # (t=0.050), then prefills beside A's decode: 10 + 4 + 2 ms.
    trace = [req(0.0, 4, 10, "A"), req(0.02, 4, 2, "B")]
    _, cfs, result = run(trace, config(gpu=8, cpu=10), every=4)
    a, b = result.requests
    assert a.token_times_s[:5] == pytest.approx([0.014, 0.026, 0.038, 0.050, 0.066], abs=1e-12)
    assert b.token_times_s == pytest.approx([0.066, 0.080], abs=1e-12)  # two decodes
    assert cfs.latest is not None and cfs.latest.prefill_chunks == ()


def test_paging_stalls_the_iteration_when_it_outlasts_compute() -> None:
    # The same moves as the hand-worked case over a 10x slower link: A's
    # 3-block page-out takes 30 ms against a 16 ms iteration (14 ms stall),
    # its page-in 30 ms against a 10 ms one (20 ms stall).
    trace = [req(0.0, 4, 10, "A"), req(0.07, 4, 2, "B"), req(0.07, 4, 2, "C")]
    _, _, result = run(trace, config(gpu=4, cpu=10), every=1, bytes_per_s=1e5)
    a, b, c = result.requests
    assert b.token_times_s == pytest.approx([0.090, 0.120], abs=1e-12)
    assert c.token_times_s == pytest.approx([0.120, 0.132], abs=1e-12)
    assert a.token_times_s[7:] == pytest.approx([0.174, 0.186, 0.198], abs=1e-12)
    assert result.totals.stall_s == pytest.approx(0.034, abs=1e-12)


@st.composite
def traces(draw: st.DrawFn, same_arrival: bool = False) -> list[TraceRequest]:
    n = draw(st.integers(1, 10))
    out = []
    t = 0.0
    for i in range(n):
        if not same_arrival:
            t += draw(st.sampled_from([0.0, 0.005, 0.02, 0.1]))
        # At most 40 + 24 - 1 tokens: 4 blocks of 16, within the pool of 6.
        out.append(req(t, draw(st.integers(1, 40)), draw(st.integers(1, 24)), f"q{i}"))
    return out


@settings(max_examples=40, deadline=None)
@given(traces(), st.sampled_from([1, 3, 8]), st.sampled_from([0, 3, 40]))
def test_every_request_finishes_once_within_the_pools(
    trace: list[TraceRequest], every: int, cpu: int
) -> None:
    cfg = config(gpu=6, cpu=cpu, bs=16, budget=32)
    engine, _, result = run(trace, cfg, every=every)
    for t, o in zip(trace, result.requests, strict=True):
        assert len(o.token_times_s) == t.output_tokens, o.id
        assert o.finish_s == o.token_times_s[-1]
        assert o.token_times_s[0] > t.arrival_s
        assert all(x <= y for x, y in itertools.pairwise(o.token_times_s))
    assert (engine.requests.phase == Phase.FINISHED).all()
    assert engine.state.free_gpu == 6 and engine.state.free_cpu == cpu
    assert result.totals.peak_gpu_kv_blocks <= 6
    assert all(s.gpu_kv_blocks_used <= 6 for s in result.timeline)


@settings(max_examples=30, deadline=None)
@given(traces(same_arrival=True), st.sampled_from([1, 8]))
def test_a_faster_paging_link_is_never_slower(trace: list[TraceRequest], every: int) -> None:
    # Everything arrives at once, so the plans do not depend on timing: the
    # same moves, each token no later over the faster link.
    cfg = config(gpu=6, cpu=40, bs=16, budget=32)
    _, _, slow = run(trace, cfg, every=every, bytes_per_s=2e4)
    _, _, fast = run(trace, cfg, every=every, bytes_per_s=2e6)
    assert fast.totals.bytes_d2h == slow.totals.bytes_d2h
    for f, s in zip(fast.requests, slow.requests, strict=True):
        assert np.all(np.array(f.token_times_s) <= np.array(s.token_times_s) + 1e-12)
    assert fast.totals.stall_s <= slow.totals.stall_s


def test_peer_paging_goes_to_the_lent_pool_over_nvlink() -> None:
    h100 = find_hardware("h100-sxm-80gb")
    assert h100 is not None
    engine = EngineConfig(gpu_kv_blocks=100, cpu_kv_blocks=5000, block_bytes=2 * 1024**2)
    same = paging_target(Paging.DRAM, engine, PCIE_GEN5_X16, h100, peer_kv_bytes=int(40e9))
    assert same == (engine, PCIE_GEN5_X16)
    peer_engine, link = paging_target(
        Paging.PEER, engine, PCIE_GEN5_X16, h100, peer_kv_bytes=int(40e9)
    )
    assert peer_engine.cpu_kv_blocks == int(40e9) // (2 * 1024**2)
    assert peer_engine.gpu_kv_blocks == 100
    # 450 GB/s per direction (900 bidirectional), the PCIe link's per-copy cost.
    assert link.gbps(float("inf"), "h2d") == pytest.approx(450.0)
    assert link.h2d.latency_s() == pytest.approx(PCIE_GEN5_X16.h2d.latency_s())
    block = engine.block_bytes
    for blocks in (1, 64):
        nbytes = blocks * block
        assert link.transfer_time_s(nbytes, nbytes, block) < PCIE_GEN5_X16.transfer_time_s(
            nbytes, nbytes, block
        )


def test_peer_link_needs_nvlink() -> None:
    h100 = find_hardware("h100-sxm-80gb")
    assert h100 is not None
    with pytest.raises(ValueError, match="no NVLink"):
        peer_link(replace(h100, nvlink_gbps=0.0), PCIE_GEN5_X16)


def test_dram_paging_in_per_layer_copies_is_latency_bound() -> None:
    h100 = find_hardware("h100-sxm-80gb")
    assert h100 is not None
    block = 2 * 1024**2
    engine = EngineConfig(gpu_kv_blocks=100, cpu_kv_blocks=5000, block_bytes=block)
    kwargs = {"peer_kv_bytes": int(40e9), "dram_copy_bytes": 32 * 1024}
    same, link = paging_target(Paging.DRAM, engine, PCIE_GEN5_X16, h100, **kwargs)
    assert same == engine
    # 64 copies of 32 KiB at 55 GB/s x 32 / (32 + 256): 6.1 GB/s, not 49.
    piecewise = link.transfer_time_s(block, 0, block)
    assert piecewise == pytest.approx(block / (55e9 * 32 / (32 + 256)))
    assert piecewise > 7 * PCIE_GEN5_X16.transfer_time_s(block, 0, block)
    assert "32,768-byte copies" in link.name
    # Only DRAM paging copies piecewise.
    assert paging_target(Paging.ENGINE, engine, PCIE_GEN5_X16, h100, **kwargs) == (
        engine,
        PCIE_GEN5_X16,
    )
    _, peer = paging_target(Paging.PEER, engine, PCIE_GEN5_X16, h100, **kwargs)
    assert peer.name.startswith("NVLink peer")


def test_a_prompt_block_shared_through_the_prefix_cache_counts_once() -> None:
    # A 12-block pool, 16-token blocks. a (4 blocks) and d (6) prefill; d is
    # swapped out (it resumes into 7 blocks). b's prompt begins as a's: it
    # starts on 3 of a's cached blocks and prefills its 4th; a grows to 5.
    # On the GPU: a's 5 and b's one own block, 6 free; then c (10 blocks)
    # queues. The pool as the partition sees it: the 6 free and a's and b's
    # own 2 + 1, 9 (the 3 shared blocks held once, outside). Fewest
    # generated first: b (2 blocks with its next token) and d (7) fill it,
    # a is paged out, and c does not fit. Counting the shared blocks once per
    # holder would see 15 blocks and page c in for a 48-token chunk that the
    # 0 blocks left after a's page-out (it frees 2) cannot take.
    trace = [
        TraceRequest(0.0, 64, 50, id="a", prefix_block_ids=(1, 2, 3, 4)),
        TraceRequest(0.0, 64, 50, id="b", prefix_block_ids=(1, 2, 3, 4)),
        TraceRequest(0.0, 160, 5, id="c"),
        TraceRequest(0.0, 96, 50, id="d"),
    ]
    requests = RequestColumns.from_trace(trace, Slo())
    prefix = PrefixCache([t.prefix_block_ids for t in trace], requests.prompt_tokens, 12, 16, 16)
    core = BatchingCore(
        EngineConfig(gpu_kv_blocks=12, cpu_kv_blocks=100, block_bytes=BLOCK_BYTES),
        Fcfs(),
        AffineCost(),
        Link(1e9),
        requests,
        prefix=prefix,
    )
    s = core.state
    none = np.zeros(0, dtype=np.int64)
    s.arrive(np.array([0, 3]), none)
    core._iteration()
    s.preempt([3], swap=True)
    s.arrive(np.array([1]), none)
    core._iteration()
    s.arrive(np.array([2]), none)
    assert (s.free_gpu, requests.gpu_blocks.tolist()) == (6, [5, 4, 0, 0])
    assert [prefix.shared_blocks(row) for row in (0, 1)] == [3, 3]
    cfs = Cfs()
    plan = cfs.plan(
        EngineView(
            now_s=core.now_s,
            requests=requests,
            queued=s.queued.rows,
            running=s.running.rows,
            rotary=s.rotary.rows,
            free_gpu_blocks=s.free_gpu,
            free_cpu_blocks=s.free_cpu,
            block_size_tokens=16,
            last_iteration_s=0.0,
            prefix=prefix,
        )
    )
    assert (plan.swap_out.tolist(), plan.start.tolist()) == ([0], [3])
    assert cfs.latest is not None
    assert cfs.latest.decode_ids == ("b", "d")
    assert cfs.latest.prefill_chunks == ()
    assert cfs.latest.blocks_used == 9
