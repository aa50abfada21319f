"""Largest-VLT-First and DuplexKV planning on small cases, numbers by hand
(DESIGN.md §3.1, SuperInfer §4.2 Algorithm 1 and §4.3)."""

from __future__ import annotations

import numpy as np
import pytest
from planner.kernels.transfer_batch import BlockExtent, CopyDirection, TransferBatch
from rotation_builders import (
    ROTARY,
    RUNNING,
    WAITING,
    ids,
    make_inputs,
    make_snapshot,
    plan,
    rotary,
    running,
    waiting,
)

from planner.domain.requests import NO_BLOCK, BlockPools, Slo
from planner.domain.rotation import (
    PAPER_TRANSFER_BUDGET_BLOCKS,
    BudgetSource,
    MoveKind,
    RequestBlockMoves,
    RequestDecision,
)
from planner.policies.duplexkv import merge_extents
from planner.policies.rotation import transfer_budget, virtual_lag_time
from planner.profiles import HARDWARE_PROFILES, MODEL_PROFILES, HardwareProfile

LLAMA_8B = MODEL_PROFILES["llama-3-8b"]
# 2 (K and V) * 32 layers * 8 KV heads * 128 dims * 2 bytes * 16 tokens.
LLAMA_8B_BLOCK_BYTES = 2 * 32 * 8 * 128 * 2 * 16


def vlts(requests, now_s, **kw):
    snapshot = make_snapshot(requests, now_s, 0)
    return virtual_lag_time(snapshot.requests, now_s, make_inputs(**kw)).tolist()


# --- Virtual Lag Time -------------------------------------------------------


def test_vlt_waiting_is_relu_of_wait_beyond_ttft_tolerance():
    # relu(10 - 2 - 0.5 * 5) = 5.5; relu(10 - 8 - 2.5) = relu(-0.5) = 0;
    # relu(10 - 7.5 - 2.5) = 0 exactly at the tolerance.
    got = vlts([waiting("a", 2.0, 1), waiting("b", 8.0, 1), waiting("c", 7.5, 1)], 10.0)
    assert got == [5.5, 0.0, 0.0]


def test_vlt_waiting_beta_ttft_and_slo_scale_the_tolerance():
    reqs = [waiting("a", 2.0, 1)]
    # beta_ttft 0: plain wait 8. beta_ttft 1, TTFT SLO 3: 8 - 3 = 5.
    # beta_ttft -0.5: the tolerance turns into a head start, 8 + 2.5 = 10.5.
    assert vlts(reqs, 10.0, beta_ttft=0.0) == [8.0]
    assert vlts(reqs, 10.0, beta_ttft=1.0, slo=Slo(ttft_s=3.0)) == [5.0]
    assert vlts(reqs, 10.0, beta_ttft=-0.5) == [10.5]


def test_vlt_waiting_per_request_ttft_slo_overrides_the_snapshot_slo():
    reqs = [waiting("own", 2.0, 1, slo_ttft_s=1.0), waiting("default", 2.0, 1)]
    # own: 10 - 2 - 0.5 * 1 = 7.5; default: 10 - 2 - 0.5 * 5 = 5.5.
    assert vlts(reqs, 10.0) == [7.5, 5.5]
    # alpha weighs rotary requests only.
    assert vlts(reqs, 10.0, alpha=10.0) == [7.5, 5.5]


def test_vlt_rotary_is_alpha_times_relu_of_gap_beyond_tbt_tolerance():
    reqs = [rotary("r", 9.75, 1), rotary("just", 10.0, 1)]
    # alpha 3, beta_tbt 0: 3 * 0.25 = 0.75; a token just now: 0.
    assert vlts(reqs, 10.0) == [0.75, 0.0]
    assert vlts(reqs, 10.0, alpha=1.0) == [0.25, 0.0]
    assert vlts(reqs, 10.0, alpha=0.0) == [0.0, 0.0]


def test_vlt_rotary_beta_tbt_and_per_request_tbt_slo():
    reqs = [
        rotary("default", 9.0, 1),
        rotary("own", 9.0, 1, slo_tbt_s=0.5),
        rotary("clipped", 9.5, 1, slo_tbt_s=0.5),
    ]
    # beta_tbt 1, TBT SLO 0.25: default 3 * (1 - 0.25) = 2.25; own
    # 3 * (1 - 0.5) = 1.5; clipped 3 * relu(0.5 - 0.5) = 0.
    assert vlts(reqs, 10.0, beta_tbt=1.0, slo=Slo(tbt_s=0.25)) == [2.25, 1.5, 0.0]
    # beta_tbt -2 (the paper's advice for TBT tails): the gap grows by
    # 2 * SLO: 3 * (1 + 0.5) = 4.5, 3 * (1 + 1) = 6, 3 * (0.5 + 1) = 4.5.
    assert vlts(reqs, 10.0, beta_tbt=-2.0, slo=Slo(tbt_s=0.25)) == [4.5, 6.0, 4.5]


def test_vlt_running_is_minus_time_since_run_start():
    reqs = [running("old", 1.0), running("new", 9.5), running("now", 10.0)]
    got = vlts(reqs, 10.0, alpha=7.0, beta_ttft=3.0, beta_tbt=3.0)
    assert got == [-9.0, -0.5, 0.0]


# --- The issue's example -------------------------------------------------------


def test_issue_example_exact_plan():
    """now 10, 40 free blocks, B_xfer 50, alpha 3, beta_tbt 0, beta_ttft 0.5,
    SLOs TTFT 5 s / TBT 0.1 s.

    a WAITING: VLT relu(10 - 2 - 2.5) = 5.5, needs 30 + 1 = 31 blocks.
    b RUNNING: VLT -(10 - 1) = -9, holds 60 blocks.
    c ROTARY: VLT 3 * relu(10 - 9.7 - 0) = 0.9, needs its 25 CPU blocks.
    Contention: 40 < 31 + 25. B_left = 40 + 50 = 90 -> a (59) -> c (34).
    B_swap = 50 - 34 = 16 > 0 -> preempt b from the tail.
    """
    p = plan(
        [
            waiting("a", 2.0, 30),
            running("b", 1.0, 60),
            rotary("c", 9.7, 25),
        ],
        10.0,
        40,
        alpha=3.0,
        beta_tbt=0.0,
        beta_ttft=0.5,
        transfer_budget_blocks=50,
        slo=Slo(ttft_s=5.0, tbt_s=0.1),
    )
    assert not p.fcfs_fallback
    assert ids(p.prioritized) == ["a", "c"]
    assert p.prioritized[0] == RequestDecision("a", WAITING, 5.5, 31)
    assert p.prioritized[1].state == ROTARY
    assert p.prioritized[1].vlt == pytest.approx(0.9)
    assert p.prioritized[1].blocks == 25
    assert p.preempted == (RequestDecision("b", RUNNING, -9.0, 60),)
    e = p.explanation
    assert (e.transfer_budget_blocks, e.budget_source) == (50, BudgetSource.GIVEN)
    assert (e.free_gpu_blocks, e.blocks_needed) == (40, 56)
    assert (e.blocks_left, e.swap_blocks_needed, e.unmet_swap_blocks) == (34, 16, 0)
    # Counts level, no synced blocks: all 60 go D2H, none released at once.
    assert (e.blocks_released_now, e.blocks_freed_after_d2h) == (0, 60)
    assert (e.swap_out_blocks, e.swap_in_blocks) == (60, 25)
    assert e.trimmed_ids == e.deferred_swap_in_ids == e.cpu_full_skipped_ids == ()
    assert p.batches == () and p.moves == ()


# --- Contention check ------------------------------------------------------------


def _fcfs_requests():
    return [
        waiting("x", 3.0, 9),  # needs 10
        rotary("y", 1.0, 20, arrival_s=2.0),  # needs 20
        waiting("z", 1.0, 4),  # needs 5
        running("r", 0.0, 50),
    ]


def test_no_contention_admits_all_in_arrival_order_and_preempts_nothing():
    # Needs 10 + 20 + 5 = 35 <= 35 free: FCFS, despite y's larger VLT (27).
    p = plan(_fcfs_requests(), 10.0, 35, transfer_budget_blocks=7)
    assert p.fcfs_fallback
    assert ids(p.prioritized) == ["z", "y", "x"]
    assert [d.blocks for d in p.prioritized] == [5, 20, 10]
    assert p.prioritized[1].vlt == 27.0  # 3 * (10 - 1), reported even under FCFS
    assert p.preempted == ()
    assert p.explanation.blocks_needed == 35
    assert p.explanation.blocks_left == 35 + 7 - 35
    assert p.explanation.swap_blocks_needed == 0


def test_one_block_short_is_contention_and_lvf_order():
    # 34 free < 35: LVF. VLTs: y 27, z relu(9 - 2.5) = 6.5, x 4.5, r -10.
    # B_left = 34 + 7 = 41 -> y 21 -> z 16 -> x 6; B_swap = 7 - 6 = 1.
    p = plan(_fcfs_requests(), 10.0, 34, transfer_budget_blocks=7)
    assert not p.fcfs_fallback
    assert ids(p.prioritized) == ["y", "z", "x"]
    assert [d.vlt for d in p.prioritized] == [27.0, 6.5, 4.5]
    assert p.preempted == (RequestDecision("r", RUNNING, -10.0, 50),)
    assert (p.explanation.blocks_left, p.explanation.swap_blocks_needed) == (6, 1)


def test_fcfs_puts_requests_without_arrival_last_then_by_id():
    reqs = [rotary("q", 9.0, 1), rotary("p", 9.0, 1), waiting("w", 5.0, 1)]
    p = plan(reqs, 10.0, 100)
    assert p.fcfs_fallback
    assert ids(p.prioritized) == ["w", "p", "q"]


# --- Sort and tie-breaks -----------------------------------------------------------


def test_equal_vlt_earlier_arrival_wins_the_last_slot():
    # p: 10 - 2 - 0.5 * 5 = 5.5; q: 10 - 1 - 0.5 * 7 = 5.5. Equal VLT, q
    # arrived first, so q takes the only 10 blocks (0 free + B_xfer 10).
    reqs = [
        waiting("p", 2.0, 9),
        waiting("q", 1.0, 9, slo_ttft_s=7.0),
        running("r", 0.0, 10),
    ]
    p = plan(reqs, 10.0, 0, transfer_budget_blocks=10)
    assert [(d.id, d.vlt) for d in p.prioritized] == [("q", 5.5)]
    assert ids(p.preempted) == ["r"]


def test_equal_vlt_and_arrival_falls_back_to_id():
    # Both within tolerance (VLT 0), same arrival: "m" sorts before "n".
    reqs = [waiting("n", 8.0, 4), waiting("m", 8.0, 4), running("r", 0.0, 5)]
    p = plan(reqs, 10.0, 0, transfer_budget_blocks=5)
    assert [(d.id, d.vlt) for d in p.prioritized] == [("m", 0.0)]


def test_zero_vlt_ties_order_by_arrival_then_id():
    reqs = [
        waiting("a", 9.0, 0),
        waiting("y", 8.0, 0),
        waiting("x", 8.0, 0),
        rotary("d", 10.0, 1, arrival_s=8.5),
        running("r", 0.0, 10),
    ]
    # Every inactive VLT is 0; needs 1, 1, 1, 1 > 3 free.
    p = plan(reqs, 10.0, 3, transfer_budget_blocks=10)
    assert ids(p.prioritized) == ["x", "y", "d", "a"]
    assert all(d.vlt == 0.0 for d in p.prioritized)


def test_preemption_tie_goes_to_the_tail_of_the_ranking():
    # r1, r2 both VLT -5; ranked r1 (arrival 1) before r2 (arrival 2), so r2
    # is at the tail and goes first. B_swap = 5 - 0 = 5 = r2's blocks.
    reqs = [
        waiting("w", 0.0, 4),
        running("r1", 5.0, 5, arrival_s=1.0),
        running("r2", 5.0, 5, arrival_s=2.0),
    ]
    p = plan(reqs, 10.0, 0, transfer_budget_blocks=5)
    assert ids(p.preempted) == ["r2"]
    # No arrivals: ranked by id, "rb" at the tail.
    reqs = [waiting("w", 0.0, 4), running("ra", 5.0, 5), running("rb", 5.0, 5)]
    assert ids(plan(reqs, 10.0, 0, transfer_budget_blocks=5).preempted) == ["rb"]


# --- Prioritize: keep walking ------------------------------------------------------


def test_keep_walking_skips_what_does_not_fit_and_takes_smaller_later_ones():
    """0 free, B_xfer 20, beta_ttft 0.5, TTFT SLO 5 (tolerance 2.5).

    big WAITING arr 1: VLT 6.5, needs 30 > 20: skipped.
    small WAITING arr 3: VLT 4.5, needs 10: taken, B_left 10.
    mid ROTARY last 9: VLT 3 * 1 = 3, needs 15 > 10: skipped.
    tiny WAITING arr 6: VLT 1.5, needs 5: taken, B_left 5.
    B_swap = 20 - 5 = 15: r2 (VLT -10, 8 blocks) leaves 7, r1 (VLT -8, 10
    blocks) leaves -3: stop.
    """
    reqs = [
        waiting("big", 1.0, 29),
        waiting("small", 3.0, 9),
        rotary("mid", 9.0, 15),
        waiting("tiny", 6.0, 4),
        running("r1", 2.0, 10),
        running("r2", 0.0, 8),
    ]
    p = plan(reqs, 10.0, 0, transfer_budget_blocks=20)
    assert [(d.id, d.vlt, d.blocks) for d in p.prioritized] == [
        ("small", 4.5, 10),
        ("tiny", 1.5, 5),
    ]
    assert [(d.id, d.vlt, d.blocks) for d in p.preempted] == [("r2", -10.0, 8), ("r1", -8.0, 10)]
    assert (p.explanation.blocks_left, p.explanation.swap_blocks_needed) == (5, 15)


def test_waiting_needs_prompt_blocks_plus_one():
    base = [running("r", 0.0, 20)]
    # prompt 10 -> needs 11 > 0 + 10: not taken, nothing preempted.
    p = plan([waiting("w", 0.0, 10), *base], 10.0, 0, transfer_budget_blocks=10)
    assert p.prioritized == () and p.preempted == ()
    assert p.explanation.blocks_needed == 11
    # prompt 9 -> needs exactly 10: taken and charged 10.
    p = plan([waiting("w", 0.0, 9), *base], 10.0, 0, transfer_budget_blocks=10)
    assert [(d.id, d.blocks) for d in p.prioritized] == [("w", 10)]
    # The contention check counts the +1 too: 10 free < 11.
    p = plan([waiting("w", 0.0, 10), *base], 10.0, 10, transfer_budget_blocks=10)
    assert not p.fcfs_fallback


def test_running_requests_are_not_charged_and_not_prioritized():
    # Paper pseudo-code would charge the just-started r0 (VLT 0 >= 0). Here
    # B_left = 0 + 10 goes entirely to w.
    reqs = [waiting("w", 0.0, 9), running("r0", 10.0, 50), running("r1", 1.0, 10)]
    p = plan(reqs, 10.0, 0, transfer_budget_blocks=10)
    assert ids(p.prioritized) == ["w"]
    assert ids(p.preempted) == ["r1"]


# --- Preempt from the tail -----------------------------------------------------------


def _three_running():
    return [running("old", 0.0, 12), running("mid", 3.0, 12), running("new", 6.0, 12)]


def test_preemption_stops_once_swap_is_covered():
    # B_swap = 12 exactly: the oldest alone covers it.
    p = plan([waiting("w", 0.0, 11), *_three_running()], 10.0, 0, transfer_budget_blocks=12)
    assert [(d.id, d.vlt, d.blocks) for d in p.preempted] == [("old", -10.0, 12)]
    # B_swap = 13: one more.
    p = plan([waiting("w", 0.0, 12), *_three_running()], 10.0, 0, transfer_budget_blocks=13)
    assert ids(p.preempted) == ["old", "mid"]
    assert p.explanation.blocks_freed_after_d2h == 24


def test_no_preemption_when_free_blocks_cover_the_picks():
    # 5 free < 4 + 2 needed: contention. B_xfer 0: B_left 5 -> w (VLT 7.5,
    # needs 4) -> 1; v (VLT 0, needs 2) does not fit. B_swap = 0 - 1 < 0:
    # the picks fit in the free blocks, nothing is preempted.
    reqs = [waiting("w", 0.0, 3), waiting("v", 9.0, 1), *_three_running()]
    p = plan(reqs, 10.0, 5, transfer_budget_blocks=0)
    assert ids(p.prioritized) == ["w"]
    assert p.preempted == ()
    assert p.explanation.swap_blocks_needed == 0


def test_running_with_vlt_zero_is_never_preempted_and_picks_are_trimmed():
    """just started now (VLT 0, 50 blocks) is no candidate; old (VLT -0.5)
    frees 5 of the 20 needed: unmet 15. Trimming drops w (20 >= 15); with
    nothing picked B_swap = 20 - 20 = 0, so nothing is preempted."""
    reqs = [waiting("w", 0.0, 19), running("just", 10.0, 50), running("old", 9.5, 5)]
    p = plan(reqs, 10.0, 0, transfer_budget_blocks=20)
    assert p.prioritized == () and p.preempted == ()
    e = p.explanation
    assert e.unmet_swap_blocks == 15
    assert e.trimmed_ids == ("w",)
    assert e.blocks_left == 20
    assert e.swap_blocks_needed == 0  # B_swap after trimming: nothing left to free


def test_trimming_drops_least_lagging_picks_until_the_shortfall_is_covered():
    """0 free, B_xfer 30; VLTs a 9.5 > b 7.5 > c 5.5, needs 10, 10, 5.
    All picked: B_left 5, B_swap 25; r (12 blocks) is the only candidate:
    unmet 13. Dropping from the end: c gives back 5 (< 13), b 10 more (15
    >= 13). Left a: B_left 20, B_swap 10, r preempted again."""
    reqs = [
        waiting("a", 0.0, 9, slo_ttft_s=1.0),
        waiting("b", 2.0, 9, slo_ttft_s=1.0),
        waiting("c", 4.0, 4, slo_ttft_s=1.0),
        running("r", 0.0, 12),
    ]
    p = plan(reqs, 10.0, 0, transfer_budget_blocks=30)
    assert [(d.id, d.vlt) for d in p.prioritized] == [("a", 9.5)]
    assert ids(p.preempted) == ["r"]
    e = p.explanation
    assert e.unmet_swap_blocks == 13
    assert e.trimmed_ids == ("c", "b")  # in drop order: least lagging first
    assert e.blocks_left == 20
    assert e.swap_blocks_needed == 10  # B_swap after trimming


def test_cpu_pool_too_small_for_dirty_blocks_skips_the_candidate():
    """free CPU 5. B_swap 10. old (tail) has 10 - 2 = 8 DIRTY blocks > 5:
    skipped. mid has 10 - 6 = 4 DIRTY: preempted, 6 SYNCED released at once,
    4 copied out. Eager: room min(B_xfer 10 - 4, CPU 5 - 4) = 1 of the fresh
    full blocks (old 9 full - 2 synced = 7, new 4 - 0 = 4)."""
    reqs = [
        waiting("w", 0.0, 9),
        running("old", 0.0, 10, synced_blocks=2),
        running("mid", 3.0, 10, synced_blocks=6),
        running("new", 6.0, 5),
    ]
    p = plan(reqs, 10.0, 0, free_cpu_blocks=5, transfer_budget_blocks=10)
    assert ids(p.prioritized) == ["w"]
    assert ids(p.preempted) == ["mid"]
    e = p.explanation
    assert e.cpu_full_skipped_ids == ("old",)
    assert (e.blocks_released_now, e.blocks_freed_after_d2h, e.swap_out_blocks) == (6, 4, 4)
    assert e.unmet_swap_blocks == 0
    assert e.eager_blocks == 1


def test_cpu_full_skip_is_reported_when_it_forces_trimming():
    # The only candidate has 10 DIRTY blocks and 3 CPU blocks are free.
    reqs = [waiting("w", 0.0, 4), running("r", 0.0, 10)]
    p = plan(reqs, 10.0, 0, free_cpu_blocks=3, transfer_budget_blocks=10)
    assert p.prioritized == () and p.preempted == ()
    assert p.explanation.cpu_full_skipped_ids == ("r",)
    assert p.explanation.trimmed_ids == ("w",)
    assert p.explanation.unmet_swap_blocks == 5


# --- Transfer budget ---------------------------------------------------------------


def _budget(**kw):
    last = kw.pop("last_iteration_s", None)
    block = kw.pop("block_size_tokens", 16)
    snapshot = make_snapshot([], 0.0, 0, last_iteration_s=last, block_size_tokens=block)
    return transfer_budget(snapshot, make_inputs(**kw))


def test_transfer_budget_given_wins():
    got = _budget(
        transfer_budget_blocks=7,
        model=LLAMA_8B,
        hardware=HARDWARE_PROFILES["h100-sxm-80gb"],
        last_iteration_s=0.02,
    )
    assert got == (7, BudgetSource.GIVEN)


def test_transfer_budget_derived_from_link_window_and_block_bytes():
    assert LLAMA_8B.block_bytes(16) == LLAMA_8B_BLOCK_BYTES == 2_097_152
    # Full duplex 55 GB/s: floor(55e9 * 0.02 / 2097152) = floor(524.52) = 524.
    got = _budget(
        model=LLAMA_8B, hardware=HARDWARE_PROFILES["h100-sxm-80gb"], last_iteration_s=0.02
    )
    assert got == (524, BudgetSource.DERIVED)
    # Half duplex 20 and 30 GB/s take turns: 1 / (1/20e9 + 1/30e9) = 12e9 B/s;
    # 32-token blocks are 4194304 bytes: floor(12e9 * 0.01 / 4194304) = 28.
    half = HardwareProfile("half", 0, 20.0, 30.0, False)
    got = _budget(model=LLAMA_8B, hardware=half, last_iteration_s=0.01, block_size_tokens=32)
    assert got == (28, BudgetSource.DERIVED)


@pytest.mark.parametrize("missing", ["model", "hardware", "last_iteration_s"])
def test_transfer_budget_defaults_to_paper_value_when_anything_is_missing(missing):
    kw = {
        "model": LLAMA_8B,
        "hardware": HARDWARE_PROFILES["gh200-144gb"],
        "last_iteration_s": 0.05,
    }
    kw[missing] = None
    assert _budget(**kw) == (PAPER_TRANSFER_BUDGET_BLOCKS, BudgetSource.DEFAULT)
    assert PAPER_TRANSFER_BUDGET_BLOCKS == 2400


def test_derived_budget_drives_the_plan():
    # B_xfer = floor(55e9 * 0.0005 / 2097152) = 13: the 13-block request fits
    # (0 free), the 14-block one does not.
    h100 = HARDWARE_PROFILES["h100-sxm-80gb"]
    reqs = [waiting("big", 0.0, 13), waiting("fit", 1.0, 12), running("r", 0.0, 20)]
    p = plan(reqs, 10.0, 0, last_iteration_s=0.0005, model=LLAMA_8B, hardware=h100)
    assert p.explanation.transfer_budget_blocks == 13
    assert p.explanation.budget_source == BudgetSource.DERIVED
    assert ids(p.prioritized) == ["fit"]


# --- Block-level DuplexKV ----------------------------------------------------------


def _block_requests(old_cpu_ids=(100, 101, NO_BLOCK)):
    """old: 4 GPU blocks 10..13, 60 tokens (3 full); by default blocks 0 and
    1 are SYNCED (CPU 100, 101), block 2 is full and DIRTY, block 3 partial.
    new: GPU 20..22, 48 tokens (3 full, none copied). rot: CPU 200..203."""
    return [
        running(
            "old", 0.0, gpu_block_ids=(10, 11, 12, 13), num_tokens=60, cpu_block_ids=old_cpu_ids
        ),
        running("new", 5.0, gpu_block_ids=(20, 21, 22), num_tokens=48),
        rotary("rot", 8.0, cpu_block_ids=(200, 201, 202, 203)),
    ]


POOLS = BlockPools(free_gpu_block_ids=(31, 30), free_cpu_block_ids=tuple(range(309, 299, -1)))


def test_block_level_preemption_release_swap_in_and_eager():
    """rot VLT 3 * 2 = 6 needs 4 > 2 free; B_xfer 4: B_left 6 -> 2, B_swap 2.
    old (VLT -10, tail) is preempted: SYNCED 10, 11 released now; DIRTY 12,
    13 go D2H to CPU 300, 301 and are free only after the copy. rot's H2D
    goes to the free 30, 31, then the released 10, 11, never to 12 or 13.
    Eager budget = B_xfer 4 - swap-out 2 = 2: new's full blocks 0, 1
    (GPU 20, 21) to CPU 302, 303."""
    p = plan(_block_requests(), 10.0, pools=POOLS, transfer_budget_blocks=4, model=LLAMA_8B)
    assert [(d.id, d.vlt, d.blocks) for d in p.prioritized] == [("rot", 6.0, 4)]
    assert [(d.id, d.vlt, d.blocks) for d in p.preempted] == [("old", -10.0, 4)]
    assert p.released_gpu_block_ids == (10, 11)
    assert p.freed_after_d2h_gpu_block_ids == (12, 13)
    assert p.moves == (
        RequestBlockMoves("old", MoveKind.SWAP_OUT, (2, 3), (12, 13), (300, 301)),
        RequestBlockMoves(
            "rot", MoveKind.SWAP_IN, (0, 1, 2, 3), (200, 201, 202, 203), (30, 31, 10, 11)
        ),
        RequestBlockMoves("new", MoveKind.EAGER, (0, 1), (20, 21), (302, 303)),
    )
    assert p.batches == (
        TransferBatch(
            CopyDirection.D2H,
            (BlockExtent(12, 300, 2), BlockExtent(20, 302, 2)),
            4,
            4 * LLAMA_8B_BLOCK_BYTES,
        ),
        TransferBatch(
            CopyDirection.H2D,
            (BlockExtent(200, 30, 2), BlockExtent(202, 10, 2)),
            4,
            4 * LLAMA_8B_BLOCK_BYTES,
        ),
    )
    e = p.explanation
    assert (e.blocks_released_now, e.blocks_freed_after_d2h) == (2, 2)
    assert (e.swap_in_blocks, e.swap_out_blocks, e.eager_blocks) == (4, 2, 2)
    assert e.deferred_swap_in_ids == ()


def test_block_level_swap_in_is_deferred_rather_than_landing_on_in_flight_blocks():
    """old has no CPU copies: all 4 blocks go D2H and none is released. Only
    30, 31 are placeable: rot (4) is deferred; rot2 (VLT 3 * 1 = 3, 1 block)
    still goes in, to 30. B_left 2 + 4 -> rot 2 -> rot2 1; B_swap 3."""
    reqs = [*_block_requests(old_cpu_ids=()), rotary("rot2", 9.0, cpu_block_ids=(210,))]
    p = plan(reqs, 10.0, pools=POOLS, transfer_budget_blocks=4, eager_budget_blocks=0)
    assert ids(p.prioritized) == ["rot2"]
    assert ids(p.preempted) == ["old"]
    assert p.explanation.deferred_swap_in_ids == ("rot",)
    assert p.released_gpu_block_ids == ()
    assert p.freed_after_d2h_gpu_block_ids == (10, 11, 12, 13)
    assert p.moves == (
        RequestBlockMoves(
            "old", MoveKind.SWAP_OUT, (0, 1, 2, 3), (10, 11, 12, 13), (300, 301, 302, 303)
        ),
        RequestBlockMoves("rot2", MoveKind.SWAP_IN, (0,), (210,), (30,)),
    )
    # No model profile: byte counts are 0.
    assert p.batches == (
        TransferBatch(CopyDirection.D2H, (BlockExtent(10, 300, 4),), 4, 0),
        TransferBatch(CopyDirection.H2D, (BlockExtent(210, 30, 1),), 1, 0),
    )
    assert p.explanation.swap_in_blocks == 1


def _eager_requests():
    # a: started 1.0, 5 blocks, 70 tokens -> 4 full, block 1 already synced.
    # b: started 0.0 (longest running), 3 blocks, num_tokens unset -> 2 full.
    return [
        running(
            "a",
            1.0,
            gpu_block_ids=(40, 41, 42, 43, 44),
            num_tokens=70,
            cpu_block_ids=(NO_BLOCK, 500),
        ),
        running("b", 0.0, gpu_block_ids=(50, 51, 52)),
    ]


def test_eager_copies_longest_running_first_within_the_eager_budget():
    pools = BlockPools((), (600, 601, 602, 603, 604, 605))
    p = plan(_eager_requests(), 10.0, pools=pools, eager_budget_blocks=3)
    assert p.fcfs_fallback and p.preempted == ()
    assert p.moves == (
        RequestBlockMoves("b", MoveKind.EAGER, (0, 1), (50, 51), (600, 601)),
        RequestBlockMoves("a", MoveKind.EAGER, (0,), (40,), (602,)),
    )
    assert p.explanation.eager_blocks == 3
    assert p.batches == (
        TransferBatch(CopyDirection.D2H, (BlockExtent(40, 602, 1), BlockExtent(50, 600, 2)), 3, 0),
    )
    # Unset eager budget: B_xfer (2400) minus swap-out (0): every fresh block
    # (b's 0, 1; a's 0, 2, 3), bounded by nothing else.
    p = plan(_eager_requests(), 10.0, pools=pools)
    assert [(m.id, m.logical_index) for m in p.moves] == [("b", (0, 1)), ("a", (0, 2, 3))]
    assert p.explanation.eager_blocks == 5


def test_eager_copies_are_bounded_by_the_free_cpu_pool():
    pools = BlockPools((), (601, 600))
    p = plan(_eager_requests(), 10.0, pools=pools, eager_budget_blocks=10)
    assert p.moves == (RequestBlockMoves("b", MoveKind.EAGER, (0, 1), (50, 51), (600, 601)),)


def test_block_level_cpu_pool_bounds_preemption_when_free_cpu_blocks_is_unset():
    """free_cpu_blocks unset but the pool lists 3 CPU ids: old has 4 DIRTY
    blocks, so it cannot be preempted (this used to index past the pool)."""
    pools = BlockPools((30, 31), (300, 301, 302))
    reqs = _block_requests(old_cpu_ids=())[::2]  # old and rot
    p = plan(reqs, 10.0, pools=pools, transfer_budget_blocks=4)
    assert p.preempted == ()
    assert p.explanation.cpu_full_skipped_ids == ("old",)
    assert p.explanation.trimmed_ids == ("rot",)
    assert all(m.kind == MoveKind.EAGER for m in p.moves)


def test_block_level_counts_come_from_block_ids():
    snapshot = make_snapshot(_block_requests(), 10.0, pools=POOLS)
    t = snapshot.requests
    assert t.gpu_blocks.tolist() == [4, 3, 0]
    assert t.synced_blocks.tolist() == [2, 0, 0]
    assert t.full_blocks.tolist() == [3, 3, 0]
    assert t.cpu_blocks[2] == 4
    assert np.array_equal(t.state, [RUNNING, RUNNING, ROTARY])


# --- Extents ---------------------------------------------------------------------


def test_merge_extents_joins_runs_consecutive_on_both_sides():
    pairs = [(5, 7), (3, 1), (4, 2), (6, 9), (7, 10), (9, 11)]
    assert merge_extents(pairs) == (
        BlockExtent(3, 1, 2),
        BlockExtent(5, 7, 1),
        BlockExtent(6, 9, 2),
        BlockExtent(9, 11, 1),
    )


def test_merge_extents_edge_cases():
    assert merge_extents([]) == ()
    assert merge_extents([(0, 0)]) == (BlockExtent(0, 0, 1),)
    # Consecutive sources, descending destinations: no merge.
    assert merge_extents([(1, 5), (2, 4)]) == (BlockExtent(1, 5, 1), BlockExtent(2, 4, 1))
    # Unordered input of one run.
    assert merge_extents([(12, 2), (10, 0), (11, 1)]) == (BlockExtent(10, 0, 3),)
