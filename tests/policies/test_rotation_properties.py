"""Invariants of Largest-VLT-First and the DuplexKV transfer plan over random
consistent snapshots, counts level and block level (DESIGN.md §3.1)."""

from __future__ import annotations

import dataclasses
import math

from hypothesis import given, settings
from hypothesis import strategies as st
from planner.kernels.transfer_batch import CopyDirection
from rotation_builders import ROTARY, RUNNING, WAITING, direction_of, make_inputs

from planner.domain.requests import (
    NO_BLOCK,
    BlockPools,
    RequestTable,
    Slo,
    Snapshot,
    TrackedRequest,
)
from planner.domain.rotation import MoveKind, RotationInputs, RotationPlan
from planner.policies.rotation import (
    blocks_needed,
    plan_rotation,
    transfer_budget,
    virtual_lag_time,
)
from planner.profiles import HARDWARE_PROFILES, MODEL_PROFILES

BLOCK = 16
NOW = 20.0
# Timestamps on a coarse grid so that equal VLTs (ties) are common.
TIMES = st.sampled_from([*(x / 4 for x in range(0, int(NOW * 4), 3)), NOW])
# RUNNING twice as likely: preemption and eager copies need running requests.
STATES = st.sampled_from([WAITING, RUNNING, RUNNING, ROTARY])
SLOS = st.one_of(st.none(), st.sampled_from([0.05, 0.1, 1.0, 5.0]))
IDS = st.text(alphabet="abcdefgh", min_size=1, max_size=3)
SETTINGS = settings(max_examples=150, deadline=None)


@dataclasses.dataclass(frozen=True)
class Case:
    """A snapshot's parts; snapshot(order) lists the requests in that order
    (and the free pools reversed)."""

    requests: tuple[TrackedRequest, ...]
    free_gpu_blocks: int
    free_cpu_blocks: int | None
    last_iteration_s: float | None
    pools: BlockPools | None = None
    max_batched_tokens: int | None = None
    max_running: int | None = None

    def snapshot(self, order: list[int] | None = None) -> Snapshot:
        requests = list(self.requests)
        pools = self.pools
        if order is not None:
            requests = [requests[i] for i in order]
            if pools is not None:
                pools = BlockPools(pools.free_gpu_block_ids[::-1], pools.free_cpu_block_ids[::-1])
        return Snapshot(
            now_s=NOW,
            free_gpu_blocks=self.free_gpu_blocks,
            requests=RequestTable.from_requests(requests, BLOCK, block_level=pools is not None),
            block_size_tokens=BLOCK,
            free_cpu_blocks=self.free_cpu_blocks,
            last_iteration_s=self.last_iteration_s,
            pools=pools,
        )


@st.composite
def rotation_inputs(draw) -> RotationInputs:
    model = hardware = None
    if draw(st.booleans()):
        model = draw(st.sampled_from(sorted(MODEL_PROFILES.values(), key=lambda m: m.name)))
        hardware = draw(st.sampled_from(sorted(HARDWARE_PROFILES.values(), key=lambda h: h.name)))
    return make_inputs(
        alpha=draw(st.sampled_from([0.0, 1.0, 3.0])),
        beta_tbt=draw(st.sampled_from([-1.0, 0.0, 0.5])),
        beta_ttft=draw(st.sampled_from([0.0, 0.5, 2.0])),
        transfer_budget_blocks=draw(st.one_of(st.none(), st.integers(0, 40))),
        eager_budget_blocks=draw(st.one_of(st.none(), st.integers(0, 10))),
        slo=Slo(draw(st.sampled_from([1.0, 5.0])), draw(st.sampled_from([0.1, 0.5]))),
        model=model,
        hardware=hardware,
    )


def _timestamps(draw, state) -> dict[str, float]:
    """The timestamp each state needs, plus sometimes the others."""
    needed = {WAITING: "arrival_s", RUNNING: "run_start_s", ROTARY: "last_token_s"}[state]
    out = {needed: draw(TIMES)}
    if needed != "arrival_s" and draw(st.booleans()):
        out["arrival_s"] = draw(TIMES)
    return out


@st.composite
def counts_cases(draw) -> Case:
    rids = draw(st.lists(IDS, min_size=1, max_size=8, unique=True))
    requests = []
    for rid in rids:
        state = draw(STATES)
        kw: dict = _timestamps(draw, state)
        kw["slo_ttft_s"] = draw(SLOS)
        kw["slo_tbt_s"] = draw(SLOS)
        if state == WAITING:
            kw["prompt_blocks"] = draw(st.integers(0, 12))
        elif state == ROTARY:
            kw["cpu_blocks"] = draw(st.integers(0, 12))
        else:
            gpu = draw(st.integers(0, 12))
            kw["gpu_blocks"] = gpu
            kw["synced_blocks"] = draw(st.integers(0, max(gpu - 1, 0)))
            if draw(st.booleans()):
                kw["num_tokens"] = draw(st.integers(max(gpu - 1, 0) * BLOCK, gpu * BLOCK))
        requests.append(TrackedRequest(rid, state, **kw))
    return Case(
        tuple(requests),
        free_gpu_blocks=draw(_free_blocks(_need(requests), 60)),
        free_cpu_blocks=draw(st.one_of(st.none(), st.integers(0, 15))),
        last_iteration_s=draw(st.one_of(st.none(), st.sampled_from([0.0005, 0.001, 0.01]))),
    )


@st.composite
def block_cases(draw) -> Case:
    """Disjoint GPU ids across the free pool and requests, disjoint CPU ids;
    CPU copies of RUNNING requests only on full blocks."""
    gpu_ids = iter(draw(_id_order(64)))
    cpu_ids = iter([1000 + i for i in draw(_id_order(96))])
    rids = draw(st.lists(IDS, min_size=1, max_size=7, unique=True))
    requests = []
    for rid in rids:
        state = draw(STATES)
        kw: dict = _timestamps(draw, state)
        kw["slo_tbt_s"] = draw(SLOS)
        if state == WAITING:
            kw["prompt_blocks"] = draw(st.integers(0, 8))
        elif state == ROTARY:
            kw["cpu_block_ids"] = tuple(next(cpu_ids) for _ in range(draw(st.integers(1, 6))))
        else:
            n = draw(st.integers(0, 6))
            kw["gpu_block_ids"] = tuple(next(gpu_ids) for _ in range(n))
            tokens = draw(st.one_of(st.none(), st.integers(max(n - 1, 0) * BLOCK, n * BLOCK)))
            kw["num_tokens"] = tokens
            full = max(n - 1, 0) if tokens is None else min(tokens // BLOCK, n)
            copies = draw(st.lists(st.booleans(), min_size=full, max_size=full))
            cpu = [next(cpu_ids) if c else NO_BLOCK for c in copies]
            kw["cpu_block_ids"] = tuple(cpu[: draw(st.integers(0, full))])
        requests.append(TrackedRequest(rid, state, **kw))
    spare = list(gpu_ids)
    free_gpu = tuple(spare[: draw(_free_blocks(_need(requests), len(spare)))])
    free_cpu = tuple(next(cpu_ids) for _ in range(draw(st.integers(0, 24))))
    return Case(
        tuple(requests),
        free_gpu_blocks=len(free_gpu),
        free_cpu_blocks=draw(st.sampled_from([None, len(free_cpu)])),
        last_iteration_s=draw(st.one_of(st.none(), st.sampled_from([0.0005, 0.001]))),
        pools=BlockPools(free_gpu, free_cpu),
    )


def _need(requests: list[TrackedRequest]) -> int:
    """Blocks the WAITING and ROTARY requests need together."""
    return sum(
        r.prompt_blocks + 1
        if r.state == WAITING
        else (len(r.cpu_block_ids) or r.cpu_blocks)
        if r.state == ROTARY
        else 0
        for r in requests
    )


def _free_blocks(need: int, most: int):
    """Free GPU blocks: mostly fewer than needed (contention), sometimes not."""
    return st.one_of(st.integers(0, min(need, most)), st.integers(0, most))


def _id_order(n: int):
    """Block ids 0..n-1 in order (so extents merge) or shuffled."""
    return st.one_of(st.just(list(range(n))), st.permutations(range(n)))


def _rows(snapshot: Snapshot) -> dict[str, int]:
    return {rid: i for i, rid in enumerate(snapshot.requests.ids)}


def _rank_key(t: RequestTable, vlt, i: int) -> tuple[float, float, str]:
    arrival = float(t.arrival_s[i])
    return (-float(vlt[i]), math.inf if math.isnan(arrival) else arrival, t.ids[i])


def check_plan(snapshot: Snapshot, inputs: RotationInputs, plan: RotationPlan) -> None:
    """Invariants that hold at counts and at block level."""
    t = snapshot.requests
    row = _rows(snapshot)
    vlt = virtual_lag_time(t, snapshot.now_s, inputs)
    need = blocks_needed(t)
    budget, _ = transfer_budget(snapshot, inputs)
    free = snapshot.free_gpu_blocks
    e = plan.explanation
    pri = [row[d.id] for d in plan.prioritized]
    pre = [row[d.id] for d in plan.preempted]
    deferred = [row[i] for i in e.deferred_swap_in_ids]
    inactive = [i for i in range(len(t)) if t.state[i] != RUNNING]

    # Who may be picked, and the numbers they carry.
    assert all(t.state[i] in (WAITING, ROTARY) for i in pri)
    assert all(t.state[i] == RUNNING and vlt[i] < 0 for i in pre)
    assert all(t.state[i] == ROTARY for i in deferred)
    assert len(set(pri)) == len(pri) and len(set(pre)) == len(pre)
    assert not set(pri) & set(pre) and not set(pri) & set(deferred)
    for d in plan.prioritized:
        assert (d.state, d.vlt, d.blocks) == (t.state[row[d.id]], vlt[row[d.id]], need[row[d.id]])
    for d in plan.preempted:
        assert (d.state, d.vlt, d.blocks) == (RUNNING, vlt[row[d.id]], t.gpu_blocks[row[d.id]])

    # Room: within free + B_xfer, and within free + what preemption frees.
    picked = int(need[pri].sum())
    freed = sum(d.blocks for d in plan.preempted)
    assert e.blocks_released_now + e.blocks_freed_after_d2h == freed
    assert picked <= free + budget
    assert picked <= free + e.blocks_released_now + e.blocks_freed_after_d2h
    assert e.transfer_budget_blocks == budget and e.free_gpu_blocks == free
    assert e.blocks_needed == int(need[inactive].sum())
    # Swap-ins: every prioritized ROTARY request, into blocks free or
    # released at once (never ones whose D2H copy is in flight).
    swap_in = sum(d.blocks for d in plan.prioritized if d.state == ROTARY)
    assert e.swap_in_blocks == swap_in <= free + e.blocks_released_now

    # Eager copies stay within their budget.
    eager_budget = inputs.params.eager_budget_blocks
    if eager_budget is None:
        eager_budget = max(budget - e.swap_out_blocks, 0)
    assert 0 <= e.eager_blocks <= eager_budget

    # Contention check.
    no_contention = free >= int(need[inactive].sum())
    assert plan.fcfs_fallback == no_contention
    if no_contention:
        assert plan.preempted == () and deferred == []
        assert sorted(pri) == inactive
        arrivals = [t.arrival_s[i] if not math.isnan(t.arrival_s[i]) else math.inf for i in pri]
        assert arrivals == sorted(arrivals)
        return

    # LVF: picks in ranking order (VLT descending, then earlier arrival, then
    # id), all with VLT >= 0; preemptions in reverse ranking order.
    assert all(vlt[i] >= 0 for i in pri)
    assert [_rank_key(t, vlt, i) for i in pri] == sorted(_rank_key(t, vlt, i) for i in pri)
    assert [_rank_key(t, vlt, i) for i in pre] == sorted(
        (_rank_key(t, vlt, i) for i in pre), reverse=True
    )
    chosen = pri + deferred  # what the prioritize pass kept
    target = int(need[chosen].sum()) - free  # B_swap after any trimming
    # Preemption covers B_swap, longest running first, stopping once it is.
    assert freed >= target
    if pre:
        assert target > freed - plan.preempted[-1].blocks
    if not e.trimmed_ids:
        # Keep walking: every lagging request left out did not fit.
        left_out = [i for i in inactive if vlt[i] >= 0 and i not in chosen]
        assert all(need[i] > e.blocks_left for i in left_out)
        assert e.blocks_left == free + budget - int(need[chosen].sum())
    # The CPU pool takes the preempted DIRTY blocks.
    room = snapshot.free_cpu_blocks
    if snapshot.pools is not None:
        pool = len(snapshot.pools.free_cpu_block_ids)
        room = pool if room is None else min(room, pool)
    if room is not None:
        assert int((t.gpu_blocks[pre] - t.synced_blocks[pre]).sum()) <= room


def check_block_plan(snapshot: Snapshot, inputs: RotationInputs, plan: RotationPlan) -> None:
    t = snapshot.requests
    row = _rows(snapshot)
    pools = snapshot.pools
    assert pools is not None
    e = plan.explanation
    released = set(plan.released_gpu_block_ids)
    in_flight = set(plan.freed_after_d2h_gpu_block_ids)
    by_kind: dict[MoveKind, list] = {k: [] for k in MoveKind}
    for m in plan.moves:
        by_kind[m.kind].append(m)
        assert len(m.logical_index) == len(m.src_block_ids) == len(m.dst_block_ids) > 0

    h2d = [
        (s, d)
        for m in by_kind[MoveKind.SWAP_IN]
        for s, d in zip(m.src_block_ids, m.dst_block_ids, strict=True)
    ]
    d2h = [
        (s, d)
        for k in (MoveKind.SWAP_OUT, MoveKind.EAGER)
        for m in by_kind[k]
        for s, d in zip(m.src_block_ids, m.dst_block_ids, strict=True)
    ]
    h2d_dst = [d for _, d in h2d]
    d2h_src = {s for s, _ in d2h}
    d2h_dst = [d for _, d in d2h]

    # The race-free invariant: no H2D destination is a D2H source.
    assert not set(h2d_dst) & d2h_src
    assert not set(h2d_dst) & in_flight
    # Swap-ins land in free or just released blocks, each block once.
    assert set(h2d_dst) <= set(pools.free_gpu_block_ids) | released
    assert len(set(h2d_dst)) == len(h2d_dst)
    # CPU destinations come from the free CPU pool, each once.
    assert set(d2h_dst) <= set(pools.free_cpu_block_ids)
    assert len(set(d2h_dst)) == len(d2h_dst)
    assert len(d2h_src) == len(d2h)

    # Preempted requests: SYNCED blocks released, DIRTY ones copied out.
    preempted = {d.id for d in plan.preempted}
    expect_released: set[int] = set()
    expect_out: set[int] = set()
    for rid in preempted:
        i = row[rid]
        cpu = t.cpu_block_ids[i]
        for k, g in enumerate(t.gpu_block_ids[i]):
            synced = k < len(cpu) and cpu[k] != NO_BLOCK
            (expect_released if synced else expect_out).add(g)
    assert released == expect_released and len(released) == len(plan.released_gpu_block_ids)
    assert in_flight == expect_out
    assert {s for m in by_kind[MoveKind.SWAP_OUT] for s in m.src_block_ids} == expect_out
    assert {m.id for m in by_kind[MoveKind.SWAP_OUT]} <= preempted

    # Swap-ins: exactly the prioritized ROTARY requests, all their CPU blocks.
    assert [m.id for m in by_kind[MoveKind.SWAP_IN]] == [
        d.id for d in plan.prioritized if d.state == ROTARY
    ]
    for m in by_kind[MoveKind.SWAP_IN]:
        assert m.src_block_ids == t.cpu_block_ids[row[m.id]]
        assert m.logical_index == tuple(range(len(m.src_block_ids)))
    # Swap-outs and eager copies read the request's own blocks; eager ones
    # only full blocks of running requests that have no CPU copy yet.
    for m in by_kind[MoveKind.SWAP_OUT] + by_kind[MoveKind.EAGER]:
        i = row[m.id]
        assert m.src_block_ids == tuple(t.gpu_block_ids[i][k] for k in m.logical_index)
    for m in by_kind[MoveKind.EAGER]:
        i = row[m.id]
        assert t.state[i] == RUNNING and m.id not in preempted
        cpu = t.cpu_block_ids[i]
        assert all(k < t.full_blocks[i] for k in m.logical_index)
        assert all(k >= len(cpu) or cpu[k] == NO_BLOCK for k in m.logical_index)
    assert e.eager_blocks == sum(len(m.src_block_ids) for m in by_kind[MoveKind.EAGER])
    assert e.swap_out_blocks == len(in_flight)
    assert e.swap_in_blocks == len(h2d)

    # Batches: at most one per direction, extents cover exactly the moves.
    block_bytes = inputs.model.block_bytes(BLOCK) if inputs.model is not None else 0
    directions = [b.direction for b in plan.batches]
    assert len(set(directions)) == len(directions)
    pairs = {CopyDirection.D2H: d2h, CopyDirection.H2D: h2d}
    for direction, expected in pairs.items():
        batch = [b for b in plan.batches if b.direction == direction]
        if not expected:
            assert batch == []
            continue
        (b,) = batch
        covered = [
            (x.src_start + k, x.dst_start + k) for x in b.extents for k in range(x.num_blocks)
        ]
        assert sorted(covered) == sorted(expected)
        assert all(x.num_blocks >= 1 for x in b.extents)
        assert b.num_blocks == len(expected)
        assert b.num_bytes == len(expected) * block_bytes
    for m in plan.moves:
        assert direction_of(m.kind) in directions


@SETTINGS
@given(counts_cases(), rotation_inputs())
def test_counts_level_invariants(case, inputs):
    snapshot = case.snapshot()
    plan = plan_rotation(snapshot, inputs)
    check_plan(snapshot, inputs, plan)
    assert plan.batches == () and plan.moves == ()
    assert plan.released_gpu_block_ids == () and plan.freed_after_d2h_gpu_block_ids == ()


@SETTINGS
@given(block_cases(), rotation_inputs())
def test_block_level_invariants(case, inputs):
    snapshot = case.snapshot()
    plan = plan_rotation(snapshot, inputs)
    check_plan(snapshot, inputs, plan)
    check_block_plan(snapshot, inputs, plan)


@SETTINGS
@given(st.one_of(counts_cases(), block_cases()), rotation_inputs(), st.randoms())
def test_plan_ignores_request_and_pool_order(case, inputs, rnd):
    order = list(range(len(case.requests)))
    rnd.shuffle(order)
    assert plan_rotation(case.snapshot(order), inputs) == plan_rotation(case.snapshot(), inputs)


@settings(max_examples=100, deadline=None)
@given(counts_cases(), rotation_inputs())
def test_no_contention_means_fcfs_and_no_preemption(case, inputs):
    t = case.snapshot().requests
    total = int(blocks_needed(t)[t.state != RUNNING].sum())
    roomy = dataclasses.replace(case, free_gpu_blocks=total + case.free_gpu_blocks % 3)
    plan = plan_rotation(roomy.snapshot(), inputs)
    assert plan.fcfs_fallback
    assert plan.preempted == ()
    assert sorted(d.id for d in plan.prioritized) == sorted(
        t.ids[i] for i in range(len(t)) if t.state[i] != RUNNING
    )
