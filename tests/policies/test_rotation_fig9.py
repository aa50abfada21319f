"""A worked example in the spirit of SuperInfer's Fig. 9: four requests A, B,
C, D of equal size (8 blocks), the GPU holds two (16 blocks), and
Largest-VLT-First rotates them.

The paper describes Fig. 9 only as "4 requests in total, HBM can only hold 2
requests; numbers refer to VLT", so the numbers here are ours, computed by
hand in each test's docstring. A small test-only driver plays the engine:
it applies each plan (preempted -> ROTARY with last_token_s = now, its blocks
now on the CPU; prioritized -> RUNNING with run_start_s = now), lets every
running request make a token during the iteration, and advances the clock by
one iteration (1 s). Request sizes stay fixed (the driver does not grow KV).

Parameters: alpha 3, beta_tbt = beta_ttft = 0, so
  WAITING VLT = now - arrival, ROTARY VLT = 3 * (now - last token),
  RUNNING VLT = -(now - run start).

DuplexKV decides whether a swap-in can land in the same iteration: only
blocks that are free or released at once (SYNCED, i.e. already copied to the
CPU) can take it, never blocks whose D2H copy is in flight. The driver runs
in one of two modes: `synced` (DuplexKV's eager copies have made every block
of a running request SYNCED before it is preempted) or not (no CPU copies,
eager copies off).
"""

from __future__ import annotations

import dataclasses

from rotation_builders import ROTARY, RUNNING, WAITING, ids, make_inputs, make_snapshot

from planner.domain.requests import TrackedRequest
from planner.domain.rotation import RotationPlan
from planner.policies.rotation import plan_rotation, virtual_lag_time

SIZE = 8  # blocks per request: a prompt of 7 + 1 for the first decode
CAPACITY = 2 * SIZE  # the GPU holds two requests
DT = 1.0  # seconds per engine iteration
TOKENS_PER_BLOCK = 16


def _running(rid: str, synced: bool, **kw: float) -> TrackedRequest:
    return TrackedRequest(
        rid,
        RUNNING,
        gpu_blocks=SIZE,
        num_tokens=SIZE * TOKENS_PER_BLOCK,
        synced_blocks=SIZE if synced else 0,
        **kw,
    )


def _used(state: dict[str, TrackedRequest]) -> int:
    return sum(r.gpu_blocks for r in state.values() if r.state == RUNNING)


def _apply(state: dict[str, TrackedRequest], p: RotationPlan, now: float, synced: bool) -> None:
    free = CAPACITY - _used(state)
    swap_in = sum(d.blocks for d in p.prioritized if d.state == ROTARY)
    # Swap-ins land only in blocks free now or released at once.
    assert swap_in <= free + p.explanation.blocks_released_now
    replace = dataclasses.replace
    for d in p.preempted:
        r = state[d.id]
        state[d.id] = replace(
            r, state=ROTARY, last_token_s=now, cpu_blocks=SIZE, gpu_blocks=0, synced_blocks=0
        )
    for d in p.prioritized:
        r = state[d.id]
        state[d.id] = _running(d.id, synced, arrival_s=r.arrival_s, run_start_s=now)
    assert _used(state) <= CAPACITY, "the plan never overfills the GPU"
    for rid, r in state.items():
        if r.state == RUNNING:  # one token each during this iteration
            state[rid] = replace(r, last_token_s=now + DT)


def _run(state: dict[str, TrackedRequest], *, budget: int, synced: bool, iterations: int = 6):
    """Per iteration: (now, VLT of each request, running set after the plan,
    prioritized, preempted, deferred swap-ins)."""
    inputs = make_inputs(
        alpha=3.0,
        beta_tbt=0.0,
        beta_ttft=0.0,
        transfer_budget_blocks=budget,
        eager_budget_blocks=None if synced else 0,
    )
    trace = []
    for i in range(1, iterations + 1):
        now = i * DT
        snapshot = make_snapshot([state[k] for k in sorted(state)], now, CAPACITY - _used(state))
        p = plan_rotation(snapshot, inputs)
        vlt = virtual_lag_time(snapshot.requests, now, inputs).tolist()
        vlt_of = dict(zip(snapshot.requests.ids, vlt, strict=True))
        assert all(vlt_of[d.id] == d.vlt for d in (*p.prioritized, *p.preempted))
        assert not p.fcfs_fallback
        _apply(state, p, now, synced)
        running = {k for k, r in state.items() if r.state == RUNNING}
        trace.append(
            (
                now,
                vlt_of,
                running,
                ids(p.prioritized),
                ids(p.preempted),
                list(p.explanation.deferred_swap_in_ids),
            )
        )
    return trace


def _ab_running_cd_waiting(synced: bool) -> dict[str, TrackedRequest]:
    """t = 0: A and B run (arrived and started at 0); C and D wait (arrived
    0.5 and 0.75)."""
    return {
        "A": _running("A", synced, arrival_s=0.0, run_start_s=0.0),
        "B": _running("B", synced, arrival_s=0.0, run_start_s=0.0),
        "C": TrackedRequest("C", WAITING, arrival_s=0.5, prompt_blocks=SIZE - 1),
        "D": TrackedRequest("D", WAITING, arrival_s=0.75, prompt_blocks=SIZE - 1),
    }


def test_fig9_two_slots_swap_pairs_every_iteration():
    """B_xfer 16 (two requests' worth), blocks SYNCED before preemption.

    now 1: A, B RUNNING since 0: -(1 - 0) = -1. C WAITING since 0.5: 0.5;
      D since 0.75: 0.25. Sorted C, D, A, B (A and B tie at -1 and arrival
      0, then by id). B_left 0 + 16 -> C -> D -> 0; B_swap = 16: preempt
      from the tail, B then A (8 + 8). Running {C, D}.
    now 2: A, B ROTARY, last token at 1: 3 * (2 - 1) = 3. C, D running since
      1: -1. Sorted A, B, C, D (C arrived first): A, B in; D, C out.
    now 3: C, D ROTARY since 2: 3; A, B running since 2: -1: C, D in; B, A
      out. The pairs swap every iteration, each rotary pair having waited one
      iteration (VLT 3 * 1), each running pair having run one (VLT -1).
    """
    trace = _run(_ab_running_cd_waiting(synced=True), budget=2 * SIZE, synced=True)
    vlt_1 = {"A": -1.0, "B": -1.0, "C": 0.5, "D": 0.25}
    ab_in = ({"A": 3.0, "B": 3.0, "C": -1.0, "D": -1.0}, {"A", "B"}, ["A", "B"], ["D", "C"], [])
    cd_in = ({"A": -1.0, "B": -1.0, "C": 3.0, "D": 3.0}, {"C", "D"}, ["C", "D"], ["B", "A"], [])
    expected = [(1.0, vlt_1, {"C", "D"}, ["C", "D"], ["B", "A"], [])]
    expected += [(float(i), *(ab_in if i % 2 == 0 else cd_in)) for i in range(2, 7)]
    assert trace == expected


def test_fig9_one_swap_per_iteration_rotates_through_all_four():
    """B_xfer 8: one request in and one out per iteration, blocks SYNCED.
    Rotary lag counts 3x, so the waiting D is overtaken by rotary requests
    until its own lag catches up.

    now 1: A -1, B -1, C 0.5, D 0.25. B_left 8 -> C -> 0; D does not fit.
      B_swap 8: the tail is B (A ranks first on id). Running {A, C}.
    now 2: A -2, C -1, B 3 * (2 - 1) = 3, D 2 - 0.75 = 1.25. B in, A (the
      longest running) out. Running {B, C}.
    now 3: C -2, B -1, A 3 * 1 = 3, D 2.25. A in, C out. Running {A, B}.
    now 4: B -2, A -1, C 3 * 1 = 3, D 3.25: D leads at last. D in, B out.
    now 5: A -2, D -1, C 3 * (5 - 3) = 6, B 3 * 1 = 3. C in, A out.
    now 6: D -2, C -1, B 3 * (6 - 4) = 6, A 3 * 1 = 3. B in, D out.
    """
    trace = _run(_ab_running_cd_waiting(synced=True), budget=SIZE, synced=True)
    assert trace == [
        (1.0, {"A": -1.0, "B": -1.0, "C": 0.5, "D": 0.25}, {"A", "C"}, ["C"], ["B"], []),
        (2.0, {"A": -2.0, "B": 3.0, "C": -1.0, "D": 1.25}, {"B", "C"}, ["B"], ["A"], []),
        (3.0, {"A": 3.0, "B": -1.0, "C": -2.0, "D": 2.25}, {"A", "B"}, ["A"], ["C"], []),
        (4.0, {"A": -1.0, "B": -2.0, "C": 3.0, "D": 3.25}, {"A", "D"}, ["D"], ["B"], []),
        (5.0, {"A": -2.0, "B": 3.0, "C": 6.0, "D": -1.0}, {"C", "D"}, ["C"], ["A"], []),
        (6.0, {"A": 3.0, "B": 6.0, "C": -1.0, "D": -2.0}, {"B", "C"}, ["B"], ["D"], []),
    ]


def test_fig9_without_cpu_copies_swap_ins_wait_for_the_d2h():
    """B_xfer 16, no CPU copies (eager copies off): a preempted request's
    blocks are free only once its D2H copy is done, so a swap-in planned in
    the same iteration is deferred to the next one. C and D start ROTARY
    (last tokens at 0.5 and 0.75), A and B RUNNING since 0.

    now 1: A -1, B -1, C 3 * 0.5 = 1.5, D 3 * 0.25 = 0.75. C, D picked; B,
      A preempted, all 16 blocks DIRTY: nothing is placeable (0 free, 0
      released), so C and D are deferred. Running {}.
    now 2: 16 free. C 3 * 1.5 = 4.5, D 3 * 1.25 = 3.75, A = B = 3 * 1 = 3.
      All four picked (B_left 16 + 16 = 32); B_swap 16 but nobody runs:
      unmet 16, the least lagging B and A are trimmed. C, D swap in.
    now 3: A = B = 3 * 2 = 6, C = D = -1: A, B picked, D, C preempted, A,
      B deferred. Running {}.
    now 4: A = B = 3 * 3 = 9, C = D = 3 * 1 = 3: A, B in, C, D trimmed.
    The GPU idles every other iteration: the cost DuplexKV's eager copies
    remove (compare the synced tests above).
    """
    state = {
        "A": _running("A", False, arrival_s=0.0, run_start_s=0.0),
        "B": _running("B", False, arrival_s=0.0, run_start_s=0.0),
        "C": TrackedRequest("C", ROTARY, arrival_s=0.0, last_token_s=0.5, cpu_blocks=SIZE),
        "D": TrackedRequest("D", ROTARY, arrival_s=0.0, last_token_s=0.75, cpu_blocks=SIZE),
    }
    trace = _run(state, budget=2 * SIZE, synced=False)
    assert [(t[0], t[2], t[3], t[4], t[5]) for t in trace] == [
        (1.0, set(), [], ["B", "A"], ["C", "D"]),
        (2.0, {"C", "D"}, ["C", "D"], [], []),
        (3.0, set(), [], ["D", "C"], ["A", "B"]),
        (4.0, {"A", "B"}, ["A", "B"], [], []),
        (5.0, set(), [], ["B", "A"], ["C", "D"]),
        (6.0, {"C", "D"}, ["C", "D"], [], []),
    ]
    assert [t[1] for t in trace[:4]] == [
        {"A": -1.0, "B": -1.0, "C": 1.5, "D": 0.75},
        {"A": 3.0, "B": 3.0, "C": 4.5, "D": 3.75},
        {"A": 6.0, "B": 6.0, "C": -1.0, "D": -1.0},
        {"A": 9.0, "B": 9.0, "C": 3.0, "D": 3.0},
    ]


def test_fig9_without_contention_nobody_rotates():
    """Control: room for all four (32 blocks, 16 free after A and B): the
    first plan is the FCFS fallback, admits C then D, preempts nobody."""
    state = _ab_running_cd_waiting(synced=True)
    snapshot = make_snapshot(list(state.values()), 1.0, 4 * SIZE - _used(state))
    p = plan_rotation(snapshot, make_inputs(beta_ttft=0.0, transfer_budget_blocks=SIZE))
    assert p.fcfs_fallback
    assert ids(p.prioritized) == ["C", "D"]
    assert p.preempted == ()
