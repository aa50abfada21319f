"""The bounded Largest-VLT-First (RotationVariant.LVF, DESIGN.md §3.1) on
hand-checked snapshots: every block moved is charged to the link budget,
only lagging requests displace running ones, only running requests with TPOT
slack to spare (or whose TPOT SLO is lost) are displaced, and waiting
requests the engine cannot start are not prioritized. Where it departs from
Algorithm 1 the paper variant's plan is shown beside it.

TPOT slack = first token + slo_tbt x tokens generated - now. With the
default TBT SLO of 100 ms: victims need >= 16 s (160 SLOs), rotary requests
lag at <= 1 s (10 SLOs), and below -1 s the TPOT SLO is lost."""

from __future__ import annotations

import math
from typing import Any

import pytest
from rotation_builders import ids, plan, rotary, running, waiting

from planner.domain.requests import TrackedRequest
from planner.domain.rotation import BudgetSource, RotationPlan, RotationVariant
from planner.profiles import HARDWARE_PROFILES, MODEL_PROFILES
from planner.profiles.hardware import HardwareProfile
from planner.profiles.link import GB

LVF = RotationVariant.LVF
PAPER = RotationVariant.LVF_PAPER
NOW = 100.0


def lvf(requests: list[TrackedRequest], free: int, **kw: Any) -> RotationPlan:
    return plan(requests, NOW, free, variant=LVF, **kw)


def paper(requests: list[TrackedRequest], free: int, **kw: Any) -> RotationPlan:
    return plan(requests, NOW, free, variant=PAPER, **kw)


def held(p: RotationPlan) -> tuple[int, int, int, int]:
    h = p.explanation.held
    return (h.engine_full, h.link_full, h.not_lagging, h.no_victim)


def busy(rid: str, run_start_s: float, slack_s: float | None, blocks: int = 20) -> TrackedRequest:
    """A running request whose 20 full blocks all have CPU copies, with the
    given TPOT slack (None: the engine sent no token count)."""
    kw: dict[str, Any] = {}
    if slack_s is not None:
        # 400 tokens generated: first token at now - 40 s + slack.
        kw = {"output_tokens": 400, "first_token_s": NOW - 40.0 + slack_s}
    return running(rid, run_start_s, blocks, num_tokens=blocks * 16, synced_blocks=blocks, **kw)


# Running: VLT = -(now - run start). From the tail (most negative first):
# unknown (-80), tight (-70), spare (-60), lost (-40).
CREW = [
    busy("unknown", 20.0, None),
    busy("tight", 30.0, 5.0),
    busy("spare", 40.0, 20.0),
    busy("lost", 60.0, -10.0),
]


# -- the link budget -----------------------------------------------------------


def test_swap_ins_into_free_blocks_are_charged():
    """Everything fits in the free blocks (the FCFS fallback), but the two
    swap-ins together exceed the 10-block budget: the later one waits."""
    requests = [
        rotary("r1", 99.0, 8, arrival_s=1.0),
        rotary("r2", 99.5, 6, arrival_s=2.0),
    ]
    p = lvf(requests, 20, transfer_budget_blocks=10)
    assert p.fcfs_fallback
    assert ids(p.prioritized) == ["r1"]
    assert p.explanation.swap_in_blocks == 8
    assert held(p) == (0, 1, 0, 0)
    assert "link budget 10 in, 10 out (given)" in p.explanation.summary
    assert "1 link budget spent" in p.explanation.summary
    # Algorithm 1 charges nothing for blocks that are free.
    p = paper(requests, 20, transfer_budget_blocks=10)
    assert ids(p.prioritized) == ["r1", "r2"]
    assert p.explanation.swap_in_blocks == 14


def test_eager_copies_take_what_the_d2h_budget_leaves():
    full = [running("a", 1.0, 10, num_tokens=160)]
    assert lvf(full, 0, transfer_budget_blocks=4).explanation.eager_blocks == 4
    # A given eager budget cannot go past the link's.
    p = lvf(full, 0, transfer_budget_blocks=4, eager_budget_blocks=6)
    assert p.explanation.eager_blocks == 4
    assert (
        paper(full, 0, transfer_budget_blocks=4, eager_budget_blocks=6).explanation.eager_blocks
        == 6
    )


def test_swap_outs_are_charged_before_eager_copies():
    """spare makes room for w; its 6 DIRTY blocks go out first, leaving 4 of
    the 10-block D2H budget to eager copies of tight's 10 fresh blocks."""
    tight = running(
        "tight",
        30.0,
        20,
        num_tokens=320,
        synced_blocks=10,
        output_tokens=400,
        first_token_s=NOW - 35.0,
    )
    spare = running(
        "spare",
        40.0,
        20,
        num_tokens=320,
        synced_blocks=14,
        output_tokens=400,
        first_token_s=NOW - 20.0,
    )
    p = lvf([tight, spare, waiting("w", 96.0, 25)], 10, transfer_budget_blocks=10)
    assert ids(p.preempted) == ["spare"]
    e = p.explanation
    assert (e.swap_out_blocks, e.blocks_released_now, e.eager_blocks) == (6, 14, 4)


def test_derived_budget_is_the_link_curve_at_the_block_size():
    """llama-3-8b on an H100: 2 MiB blocks over PCIe Gen5, 30 ms window. The
    curve gives 48.9 GB/s at 2 MiB, each way at once; Algorithm 1 takes the
    55 GB/s large-copy rate."""
    model = MODEL_PROFILES["llama-3-8b"]
    hardware = HARDWARE_PROFILES["h100-sxm-80gb"]
    block = model.block_bytes(16)
    assert block == 2 * 1024**2
    h2d, d2h = hardware.link_model().concurrent_gbps(block, block)
    assert h2d == d2h == pytest.approx(48.89, abs=0.01)
    expected = math.floor(h2d * GB * 0.03 / block)
    assert expected == 699
    kw = {"model": model, "hardware": hardware, "last_iteration_s": 0.03}
    e = lvf([running("a", 1.0, 4)], 0, **kw).explanation
    assert (e.transfer_budget_blocks, e.d2h_budget_blocks) == (699, 699)
    assert e.budget_source == BudgetSource.DERIVED and not e.link_half_duplex
    e = paper([running("a", 1.0, 4)], 0, **kw).explanation
    assert e.transfer_budget_blocks == math.floor(55e9 * 0.03 / block) == 786


def test_half_duplex_link_shares_one_budget():
    """A half-duplex link: swap-ins and copies out draw from one budget at
    the slower direction's rate."""
    hardware = HardwareProfile("half", 80 * 10**9, 20.0, 10.0, full_duplex=False)
    model = MODEL_PROFILES["llama-3-8b"]
    block = model.block_bytes(16)
    kw = {"model": model, "hardware": hardware, "last_iteration_s": 0.1}
    p = lvf([running("a", 1.0, 900, num_tokens=900 * 16)], 0, **kw)
    e = p.explanation
    assert e.link_half_duplex
    assert e.transfer_budget_blocks == e.d2h_budget_blocks == math.floor(10e9 * 0.1 / block)
    assert e.eager_blocks == e.transfer_budget_blocks == 476
    # The swap-in spends the shared budget: eager copies get the rest.
    p = lvf([running("a", 1.0, 900, num_tokens=900 * 16), rotary("q", 99.9, 400)], 1000, **kw)
    assert ids(p.prioritized) == ["q"]
    assert p.explanation.eager_blocks == 476 - 400


def test_a_swap_in_larger_than_the_whole_budget_goes_first_alone():
    requests = [rotary("big", 99.0, 30, arrival_s=1.0), rotary("small", 99.0, 2, arrival_s=2.0)]
    p = lvf(requests, 40, transfer_budget_blocks=10)
    assert ids(p.prioritized) == ["big"]
    assert p.explanation.swap_in_blocks == 30
    assert held(p) == (0, 1, 0, 0)


# -- who displaces whom ------------------------------------------------------------


def test_a_lagging_waiting_request_displaces_the_one_with_slack_to_spare():
    """w (VLT 4 - 2.5 = 1.5, 4 s < its 5 s TTFT SLO) needs 26 blocks, 10 are
    free. From the tail: unknown (no token count) and tight (5 s of slack)
    cannot be spared; spare (20 s) can, and its 20 SYNCED blocks suffice."""
    p = lvf([*CREW, waiting("w", 96.0, 25)], 10)
    assert ids(p.prioritized) == ["w"]
    assert ids(p.preempted) == ["spare"]
    assert p.explanation.blocks_released_now == 20
    # Needing 35, it takes lost (10 s behind: its TPOT SLO is gone) as well.
    p = lvf([*CREW, waiting("w", 96.0, 34)], 10)
    assert ids(p.preempted) == ["spare", "lost"]
    # Algorithm 1 takes the longest running, whatever their slack.
    assert ids(paper([*CREW, waiting("w", 96.0, 25)], 10).preempted) == ["unknown"]


@pytest.mark.parametrize(
    ("arrival_s", "why"),
    [(98.0, "within its tolerance (VLT 0)"), (90.0, "past its TTFT SLO already")],
)
def test_a_waiting_request_that_is_not_lagging_takes_free_blocks_only(arrival_s, why):
    p = lvf([*CREW, waiting("w", arrival_s, 25)], 10)
    assert p.prioritized == () and p.preempted == (), why
    assert held(p) == (0, 0, 1, 0)
    # Small enough for the free blocks, it is admitted all the same.
    assert ids(lvf([*CREW, waiting("w", arrival_s, 8)], 10).prioritized) == ["w"]


@pytest.mark.parametrize(
    ("generated", "slack_s", "displaces"),
    [
        (500, 10.0, False),  # plenty of slack left: waits for free blocks
        (405, 0.5, True),  # down to 1 s or less: lagging
        (391, -0.9, True),  # behind, but not yet lost
        (300, -10.0, False),  # lost: displaces no one
    ],
)
def test_a_rotary_request_displaces_only_while_its_slack_is_low_but_not_lost(
    generated, slack_s, displaces
):
    q = rotary("q", 99.9, 15, output_tokens=generated, first_token_s=60.0)
    assert 60.0 + 0.1 * generated - NOW == pytest.approx(slack_s)
    p = lvf([*CREW, q], 10)
    if displaces:
        assert (ids(p.prioritized), ids(p.preempted)) == (["q"], ["spare"])
    else:
        assert (p.prioritized, p.preempted) == ((), ())
        assert held(p) == (0, 0, 1, 0)


def test_no_victim_when_no_running_request_can_be_spared():
    p = lvf([*CREW[:2], waiting("w", 96.0, 25)], 10)
    assert (p.prioritized, p.preempted) == ((), ())
    assert held(p) == (0, 0, 0, 1)
    assert "1 no running request to spare" in p.explanation.summary


def test_the_knobs_move_the_thresholds():
    # tight (5 s of slack) becomes a victim once 40 SLOs (4 s) are enough.
    p = lvf([*CREW[:2], waiting("w", 96.0, 25)], 10, preempt_slack_tbts=40.0)
    assert ids(p.preempted) == ["tight"]
    # With nothing ever lost, lost cannot be taken: spare alone is short.
    p = lvf([*CREW, waiting("w", 96.0, 34)], 10, lost_slack_tbts=None)
    assert (p.prioritized, p.preempted) == ((), ())


# -- what the engine can start -------------------------------------------------------


def test_no_running_slot_left_means_no_waiting_request_is_prioritized():
    p = lvf([*CREW, waiting("w", 96.0, 25)], 10, max_running_requests=4)
    assert (p.prioritized, p.preempted) == ((), ())
    assert held(p) == (1, 0, 0, 0)
    p = lvf([*CREW, waiting("w", 96.0, 25)], 10, max_running_requests=5)
    assert ids(p.prioritized) == ["w"]


def test_the_token_budget_counts_running_prefills():
    """A running request with 80 prompt tokens still to prefill and four
    decodes take 84 tokens of the budget; w goes in only if one is left."""
    prefilling = running("pre", 90.0, 25, num_tokens=320, prefill_tokens=400)
    requests = [*CREW, prefilling, waiting("w", 96.0, 25)]
    assert held(lvf(requests, 10, max_batched_tokens=84)) == (1, 0, 0, 0)
    p = lvf(requests, 10, max_batched_tokens=85)
    assert ids(p.prioritized) == ["w"] and ids(p.preempted) == ["spare"]


def test_waiting_requests_fill_the_token_budget_in_order():
    """Each admitted request takes its prompt's tokens; the engine admits
    the next while any budget is left (chunked prefill)."""
    requests = [
        waiting("a", 96.0, 4, prefill_tokens=60),
        waiting("b", 96.5, 4, prefill_tokens=60),
        waiting("c", 97.0, 4, prefill_tokens=60),
    ]
    p = lvf(requests, 10, max_batched_tokens=100)
    assert ids(p.prioritized) == ["a", "b"]
    assert held(p) == (1, 0, 0, 0)
