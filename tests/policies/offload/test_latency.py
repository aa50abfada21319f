"""Latency models of one decode step under layer offload (DESIGN.md §3.2):
the exact event model against a brute-force time-stepped simulation, the
paper's Algorithm 1 against OrbitFlow's Fig. 3 walk-through, the surrogate,
edge cases and properties."""

from __future__ import annotations

import math
import random
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planner.policies.offload import (
    LatencyModel,
    StepInputs,
    paper_stalls_s,
    predict_step,
    simulate_step,
    step_latency_s,
    surrogate_latency_s,
    surrogate_stalls_s,
)

SETTINGS = settings(max_examples=60, deadline=None)


def brute_force_latency_s(
    comp_s: list[float],
    kv_blocks: list[float],
    resident: list[list[bool]],
    bandwidth_blocks_per_s: float,
    dt_s: float,
) -> float:
    """The spec's rules stepped in ticks of dt_s with fluid bandwidth sharing.

    Each tick: a request with no fetch in flight and its prefetch slot free
    (its last fetched layer already computed) starts fetching its next
    offloaded layer; a waiting layer starts once every fetch it needs is in;
    then compute and the in-flight fetches (B / n each) advance by dt_s.
    """
    num_layers = len(comp_s)
    num_requests = len(kv_blocks)
    offloaded = [[layer for layer in range(num_layers) if not row[layer]] for row in resident]
    next_fetch = [0] * num_requests  # index into offloaded[r]
    in_flight: dict[int, float] = {}  # request -> blocks left
    fetched = [[False] * num_layers for _ in range(num_requests)]
    layer = 0
    computing = False
    compute_left = 0.0
    t = 0.0
    while layer < num_layers:
        for r in range(num_requests):
            j = next_fetch[r]
            slot_free = j == 0 or offloaded[r][j - 1] < layer
            if r not in in_flight and j < len(offloaded[r]) and slot_free:
                in_flight[r] = kv_blocks[r]
                next_fetch[r] = j + 1
        for r, left in list(in_flight.items()):
            if left <= 1e-12:
                fetched[r][offloaded[r][next_fetch[r] - 1]] = True
                del in_flight[r]
        if not computing and all(
            resident[r][layer] or fetched[r][layer] for r in range(num_requests)
        ):
            computing = True
            compute_left = comp_s[layer]
        if computing and compute_left <= 1e-12:
            layer += 1
            computing = False
            continue
        if computing:
            compute_left -= dt_s
        if in_flight:
            share = bandwidth_blocks_per_s * dt_s / len(in_flight)
            for r in in_flight:
                in_flight[r] -= share
        t += dt_s
    return t


@st.composite
def small_steps(draw: st.DrawFn, max_layers: int = 6, max_requests: int = 3) -> StepInputs:
    num_layers = draw(st.integers(1, max_layers))
    num_requests = draw(st.integers(1, max_requests))
    # Values off the tick grid, so the simulation's rounding is exercised.
    comp = draw(
        st.lists(
            st.sampled_from([0.1037, 0.2513, 0.5, 0.9131]), min_size=num_layers, max_size=num_layers
        )
    )
    blocks = draw(st.lists(st.integers(0, 4), min_size=num_requests, max_size=num_requests))
    resident = draw(
        st.lists(
            st.lists(st.booleans(), min_size=num_layers, max_size=num_layers),
            min_size=num_requests,
            max_size=num_requests,
        )
    )
    bandwidth = draw(st.sampled_from([2.0, 3.3, 7.1]))
    return StepInputs.of(comp, blocks, resident, bandwidth)


def _brute(inputs: StepInputs, dt_s: float) -> float:
    return brute_force_latency_s(
        inputs.comp_s.tolist(),
        inputs.kv_blocks.tolist(),
        inputs.resident.tolist(),
        inputs.bandwidth_blocks_per_s,
        dt_s,
    )


# --- the exact event model against the time-stepped simulation -------------

DT_S = 1e-3


@SETTINGS
@given(small_steps())
def test_event_model_matches_time_stepped_simulation(inputs: StepInputs) -> None:
    exact = step_latency_s(
        inputs.comp_s, inputs.kv_blocks, inputs.resident, inputs.bandwidth_blocks_per_s
    )
    # Each layer end and fetch end lands up to a tick late in the simulation
    # (measured: under one tick per event over 300 random cases).
    events = inputs.num_layers + int((~inputs.resident).sum())
    tolerance = 2 * events * DT_S
    assert _brute(inputs, DT_S) == pytest.approx(exact, abs=tolerance)


def _latency(inputs: StepInputs, model: str = "exact") -> float:
    return step_latency_s(
        inputs.comp_s,
        inputs.kv_blocks,
        inputs.resident,
        inputs.bandwidth_blocks_per_s,
        model=model,
    )


def _resident(num_layers: int, *offloaded_per_request: list[int]) -> np.ndarray:
    """x from the 1-indexed offloaded layers of each request."""
    x = np.ones((len(offloaded_per_request), num_layers), dtype=np.bool_)
    for r, layers in enumerate(offloaded_per_request):
        x[r, [layer - 1 for layer in layers]] = False
    return x


def test_exact_timeline_worked_example() -> None:
    # Two requests of 3 and 6 blocks fetch layer 3 (1-indexed) from t = 0 at
    # 1.5 blocks/s each; the 3-block one is done at 2, the other then gets all
    # 3 blocks/s for its last 3 blocks and is done at 3: layer 3 waits 1 s.
    x = _resident(4, [3], [3])
    timeline = simulate_step(StepInputs.of([1, 1, 1, 1], [3, 6], x, 3.0))
    assert timeline.latency_s == 5.0
    assert timeline.stall_s.tolist() == [0.0, 0.0, 1.0, 0.0]
    assert timeline.layer_start_s.tolist() == [0.0, 1.0, 3.0, 4.0]
    assert timeline.fetch_start_s[:, 2].tolist() == [0.0, 0.0]
    assert timeline.fetch_end_s[:, 2].tolist() == [2.0, 3.0]
    assert np.isnan(timeline.fetch_start_s[:, [0, 1, 3]]).all()


def test_next_fetch_waits_for_the_slot() -> None:
    # One request offloads layers 2 and 3. Its layer-3 fetch may start only
    # once layer 2 has been computed (one prefetch slot), so it cannot overlap
    # with anything: 1 + (1 + 1) + (1 + 1) = 5.
    x = _resident(3, [2, 3])
    timeline = simulate_step(StepInputs.of([1, 1, 1], [1], x, 1.0))
    assert timeline.fetch_start_s[0].tolist()[1:] == [0.0, 2.0]
    assert timeline.fetch_end_s[0].tolist()[1:] == [1.0, 3.0]
    assert timeline.latency_s == 4.0


@SETTINGS
@given(small_steps())
def test_timeline_is_consistent(inputs: StepInputs) -> None:
    t = simulate_step(inputs)
    offloaded = ~inputs.resident
    previous_end = np.concatenate(([0.0], t.layer_end_s[:-1]))
    assert (t.layer_start_s >= previous_end).all()
    assert np.allclose(t.layer_end_s - t.layer_start_s, inputs.comp_s)
    assert (t.fetch_end_s[offloaded] >= t.fetch_start_s[offloaded]).all()
    layer_start = np.broadcast_to(t.layer_start_s, offloaded.shape)
    assert (t.fetch_end_s[offloaded] <= layer_start[offloaded] + 1e-12).all()
    # A fetch starts when the request's previous offloaded layer was computed.
    for r in range(inputs.num_requests):
        layers = np.flatnonzero(offloaded[r])
        if layers.size:
            assert t.fetch_start_s[r, layers[0]] == 0.0
            released = t.layer_end_s[layers[:-1]]
            assert np.allclose(t.fetch_start_s[r, layers[1:]], released)
    assert t.latency_s == pytest.approx(t.layer_end_s[-1])


# --- OrbitFlow Fig. 3 (paper §2.3) -------------------------------------------
# "Two concurrent requests are served on a 9-layer LLM ... the GPU can store at
# most 70 KV blocks, and the PCIe bandwidth allows transferring at most 3 KV
# blocks within the computation time of one layer." At Step 1 Request 1 has 3
# blocks per layer and Request 2 (about twice as long) 6; at Step 16 "Request 2
# still needs 6 blocks per layer, while Request 1 has grown to 4". Placement A
# offloads L3, L6, L9 of both; B keeps Request 1 whole and offloads L3, L6, L9
# of Request 2; C offloads 2 layers of Request 1 (L4, L8: distance 4) and
# L3, L6, L9 of Request 2. Time unit: one layer's compute.

FIG3_LAYERS = 9
FIG3_COMP = [1.0] * FIG3_LAYERS
FIG3_BANDWIDTH = 3.0
STEP1_BLOCKS = [3, 6]
STEP16_BLOCKS = [4, 6]
PLACEMENT_A = _resident(FIG3_LAYERS, [3, 6, 9], [3, 6, 9])
PLACEMENT_B = _resident(FIG3_LAYERS, [], [3, 6, 9])
PLACEMENT_C = _resident(FIG3_LAYERS, [4, 8], [3, 6, 9])


def _fig3(blocks: list[int], placement: np.ndarray) -> StepInputs:
    return StepInputs.of(FIG3_COMP, blocks, placement, FIG3_BANDWIDTH)


def test_paper_model_fig3_placement_a_step_1() -> None:
    # "Placement A must move 9 blocks just in time for every offloaded layer.
    # Since the bandwidth allows transferring 3 blocks per layer time, those
    # transfers spill past the preceding layer's compute and create 9 units of
    # stalls." Algorithm 1: the 3-block stream costs 3 / (3/2) = 2, the 6-block
    # one is charged whole at the new share, 6 / 3 = 2; 4 - comp_prev = 3 per
    # offloaded layer.
    inputs = _fig3(STEP1_BLOCKS, PLACEMENT_A)
    assert paper_stalls_s(inputs).tolist() == [0, 0, 3, 0, 0, 3, 0, 0, 3]
    assert _latency(inputs, "paper") == 9 + 9


def test_paper_model_fig3_placement_a_step_16() -> None:
    # "Placement A remains feasible but must now prefetch 10 blocks per layer,
    # causing 12 stalls in total." Algorithm 1 gives 4/(3/2) + 6/3 - 1 = 11/3
    # per offloaded layer, 11 in all; the figure counts whole layer-time
    # slots, ceil(11/3) = 4 per layer, hence its 12.
    stalls = paper_stalls_s(_fig3(STEP16_BLOCKS, PLACEMENT_A))
    assert stalls[[2, 5, 8]] == pytest.approx([11 / 3] * 3)
    assert stalls.sum() == pytest.approx(11)
    assert sum(math.ceil(s - 1e-9) for s in stalls) == 12


def test_paper_model_fig3_one_more_offloaded_layer_stalls_longer() -> None:
    # "Placement A is already the best uniform choice: offloading one more
    # layer ... resulting in longer stalls" (distance 2: L2, L4, L6, L8).
    denser = _resident(FIG3_LAYERS, [2, 4, 6, 8], [2, 4, 6, 8])
    assert paper_stalls_s(_fig3(STEP1_BLOCKS, denser)).sum() == 12 > 9


def test_fig3_placement_b_overlaps_perfectly_in_the_exact_model() -> None:
    # "Both Placements B and C apply request-wise placement and achieve
    # perfect overlap without stalls." B's 6-block fetch takes two layer
    # times; the exact model starts it two layers ahead, so B has no stall at
    # Step 1 or Step 16. Algorithm 1 overlaps it with one layer only (1 stall
    # per offloaded layer): it does not reproduce this number.
    for blocks in (STEP1_BLOCKS, STEP16_BLOCKS):
        inputs = _fig3(blocks, PLACEMENT_B)
        assert simulate_step(inputs).total_stall_s == 0.0
        assert paper_stalls_s(inputs).sum() == 3.0


def test_fig3_placement_c_in_both_models() -> None:
    # The text gives C no stall at Step 1 and 2 at Step 16; that needs the
    # urgent layer-3 fetch of Request 2 to go first and Request 1's layer-4
    # fetch after it. Greedy fair sharing starts both at t = 0, so the exact
    # model has Request 2's fetch done at 3 (stall 1 at L3) and again at L6;
    # Algorithm 1 charges the early-started layer-4 transfer inside layer 3's
    # walk. Neither reproduces C's figures; pinned so a change is noticed.
    step1 = _fig3(STEP1_BLOCKS, PLACEMENT_C)
    assert simulate_step(step1).stall_s.tolist() == [0, 0, 1, 0, 0, 1, 0, 0, 0]
    assert paper_stalls_s(step1).tolist() == [0, 0, 3, 0, 0, 3, 0, 0, 1]
    step16 = _fig3(STEP16_BLOCKS, PLACEMENT_C)
    assert simulate_step(step16).total_stall_s == pytest.approx(7 / 3)


def test_fig3_exact_model_on_placement_a() -> None:
    # The exact model lets A's layer-3 fetches overlap layers 1 and 2: 9
    # blocks at 3 blocks per layer time need 3, stall 1 per offloaded layer.
    assert simulate_step(_fig3(STEP1_BLOCKS, PLACEMENT_A)).total_stall_s == 3.0


def test_fig3_surrogate() -> None:
    # stall_l = fetched_l / B - comp_(l-1): A at Step 1 is 9/3 - 1 = 2 per
    # offloaded layer; B is 6/3 - 1 = 1.
    a = surrogate_stalls_s(FIG3_COMP, STEP1_BLOCKS, PLACEMENT_A, FIG3_BANDWIDTH)
    assert a.tolist() == [0, 0, 2, 0, 0, 2, 0, 0, 2]
    b = surrogate_latency_s(FIG3_COMP, STEP1_BLOCKS, PLACEMENT_B, FIG3_BANDWIDTH)
    assert float(b) == 9 + 3


# --- Algorithm 1 beyond Fig. 3 ------------------------------------------------


def test_paper_model_charges_a_stream_whole_at_the_new_share() -> None:
    # Fair sharing would finish the 6-block stream at 3 (3 blocks left at 3/s
    # after t = 2); Algorithm 1 charges 2 + 6/3 = 4.
    x = _resident(2, [2], [2])
    inputs = StepInputs.of([1.0, 1.0], [3, 6], x, 3.0)
    assert paper_stalls_s(inputs).tolist() == [0.0, 3.0]
    assert simulate_step(inputs).stall_s.tolist() == [0.0, 2.0]


def test_paper_model_fetches_layer_one_just_in_time() -> None:
    # Layer 1 offloaded: comp_prev is 0, so its whole fetch is a stall.
    x = _resident(2, [1])
    inputs = StepInputs.of([1.0, 1.0], [4], x, 2.0)
    assert paper_stalls_s(inputs).tolist() == [2.0, 0.0]
    assert simulate_step(inputs).stall_s.tolist() == [2.0, 0.0]


def test_paper_model_adjacent_offloaded_layers() -> None:
    # Layers 2 and 3 offloaded: the layer-2 transfer starts before layer 1
    # (its KV is resident), the layer-3 one just in time before layer 3.
    x = _resident(3, [2, 3])
    inputs = StepInputs.of([1.0, 1.0, 1.0], [2], x, 1.0)
    assert paper_stalls_s(inputs).tolist() == [0.0, 1.0, 1.0]


# --- edge cases -----------------------------------------------------------------


@pytest.mark.parametrize("model", ["exact", "paper", "surrogate"])
def test_nothing_offloaded_is_the_compute_sum(model: str) -> None:
    comp = [0.1037, 0.2513, 0.5, 0.9131, 0.3]
    resident = np.ones((3, 5), dtype=np.bool_)
    latency = step_latency_s(comp, [5, 7, 0], resident, 1.0, model=model)
    assert latency == sum(comp)


def test_no_requests_and_no_layers() -> None:
    assert step_latency_s([0.5, 0.25], [], np.ones((0, 2), dtype=np.bool_), 1.0) == 0.75
    assert step_latency_s([], [3], np.ones((1, 0), dtype=np.bool_), 1.0) == 0.0


@pytest.mark.parametrize("bandwidth", [1e-3, 0.5, 1e3])
def test_everything_offloaded_serializes_fetch_and_compute(bandwidth: float) -> None:
    # Each layer's fetches start when the previous layer ends (one slot per
    # request) and fill the link until the last is in: T = sum b / B + sum comp.
    # With a tiny bandwidth that is the bandwidth bound.
    comp = [0.01, 0.02, 0.03]
    blocks = [2.0, 5.0]
    resident = np.zeros((2, 3), dtype=np.bool_)
    expected = 3 * sum(blocks) / bandwidth + sum(comp)
    assert _latency(StepInputs.of(comp, blocks, resident, bandwidth)) == pytest.approx(
        expected, rel=1e-12
    )


def test_zero_block_fetch_costs_nothing() -> None:
    x = _resident(2, [1, 2], [2])
    assert step_latency_s([1.0, 1.0], [0, 0], x, 1.0) == 2.0


def test_unknown_model_is_rejected() -> None:
    with pytest.raises(ValueError):
        step_latency_s([1.0], [1], [[False]], 1.0, model="fluid")


@pytest.mark.parametrize(
    ("comp", "blocks", "resident", "bandwidth"),
    [
        ([[1.0]], [1], [[True]], 1.0),
        ([1.0], [[1]], [[True]], 1.0),
        ([1.0], [1], [True], 1.0),
        ([-1.0], [1], [[True]], 1.0),
        ([1.0], [-1], [[True]], 1.0),
        ([math.nan], [1], [[True]], 1.0),
        ([1.0], [1], [[True]], 0.0),
        ([1.0], [1], [[True]], math.inf),
    ],
)
def test_bad_inputs_are_rejected(
    comp: list[Any], blocks: list[Any], resident: list[Any], bandwidth: float
) -> None:
    with pytest.raises(ValueError):
        StepInputs.of(comp, blocks, resident, bandwidth)


def test_predict_step_dispatches() -> None:
    inputs = _fig3(STEP1_BLOCKS, PLACEMENT_A)
    assert predict_step(inputs).total_stall_s == 3.0
    assert predict_step(inputs, LatencyModel.PAPER).total_stall_s == 9.0
    assert predict_step(inputs, "surrogate").total_stall_s == 6.0
    assert predict_step(inputs, "paper").latency_s == 18.0


def test_surrogate_scores_a_stack_of_placements() -> None:
    rng = np.random.default_rng(0)
    stack = rng.random((5, 3, 4)) < 0.5
    comp = [0.5, 1.0, 0.25, 2.0]
    blocks = [1, 4, 2]
    scores = surrogate_latency_s(comp, blocks, stack, 2.0)
    assert scores.shape == (5,)
    for placement, score in zip(stack, scores, strict=True):
        assert score == pytest.approx(float(surrogate_latency_s(comp, blocks, placement, 2.0)))


# --- properties of the exact model ----------------------------------------------


@SETTINGS
@given(small_steps())
def test_exact_latency_bounds(inputs: StepInputs) -> None:
    # Work conservation: while the batch stalls some fetch is active and the
    # link runs at B, so stalls add up to at most the transfer time; every
    # block crosses the link before the step ends.
    latency = _latency(inputs)
    compute = float(inputs.comp_s.sum())
    transfer = float(inputs.fetched_blocks_per_layer().sum()) / inputs.bandwidth_blocks_per_s
    assert compute - 1e-9 <= latency <= compute + transfer + 1e-9
    assert latency >= transfer - 1e-9


@SETTINGS
@given(small_steps(), st.randoms(use_true_random=False))
def test_exact_latency_ignores_request_order(inputs: StepInputs, rnd: random.Random) -> None:
    order = list(range(inputs.num_requests))
    rnd.shuffle(order)
    shuffled = StepInputs.of(
        inputs.comp_s,
        inputs.kv_blocks[order],
        inputs.resident[order],
        inputs.bandwidth_blocks_per_s,
    )
    assert _latency(shuffled) == pytest.approx(_latency(inputs), abs=1e-12)


@SETTINGS
@given(small_steps(), st.sampled_from([0.5, 2.0, 3.0]))
def test_exact_latency_scales_with_time_unit(inputs: StepInputs, factor: float) -> None:
    # Compute times x c and bandwidth / c is the same step in another unit.
    scaled = StepInputs.of(
        inputs.comp_s * factor,
        inputs.kv_blocks,
        inputs.resident,
        inputs.bandwidth_blocks_per_s / factor,
    )
    assert _latency(scaled) == pytest.approx(factor * _latency(inputs), rel=1e-12)


@SETTINGS
@given(small_steps(max_requests=1), st.sampled_from([1.5, 2.0, 10.0]))
def test_one_request_more_bandwidth_is_never_slower(inputs: StepInputs, factor: float) -> None:
    # With one request there is no sharing: each fetch takes b / B from a
    # release time that only moves earlier, so every event moves earlier.
    # With several requests this fails (see the anomaly test below).
    faster = StepInputs.of(
        inputs.comp_s, inputs.kv_blocks, inputs.resident, inputs.bandwidth_blocks_per_s * factor
    )
    assert _latency(faster) <= _latency(inputs) + 1e-12


@SETTINGS
@given(small_steps(max_requests=1), st.data())
def test_one_request_offloading_more_is_never_faster(
    inputs: StepInputs, data: st.DataObject
) -> None:
    kept = np.flatnonzero(inputs.resident[0])
    if kept.size == 0:
        return
    layer = data.draw(st.sampled_from(kept.tolist()))
    resident = inputs.resident.copy()
    resident[0, layer] = False
    more = StepInputs.of(inputs.comp_s, inputs.kv_blocks, resident, inputs.bandwidth_blocks_per_s)
    assert _latency(more) >= _latency(inputs) - 1e-12


# Neither monotonicity holds for two or more requests in the exact model:
# greedy fair sharing is not an optimal schedule. A fetch released earlier than
# before (or one that is started at all) takes a share of the link from a more
# urgent fetch of another request, and the layer waiting for that one starts
# later. The two cases below were found by random search and are confirmed by
# the time-stepped simulation, so the anomaly is the spec's, not the code's.


def test_anomaly_offloading_one_more_layer_can_be_faster() -> None:
    # Rows are requests 0..2, layers 1-indexed. Request 1 keeps layer 1 at
    # first: its layer-3 fetch starts at t = 0 and, with request 0's released
    # after layer 1, slows request 2's layer-2 fetch (layer 2 stalls 0.875).
    # Offloading request 1's layer 1 too costs 0.5 more stall before layer 1,
    # but both layer-3 fetches then start after layer 1, request 2's layer-2
    # fetch is in when layer 2 may start, and the layer-3 fetches hide under
    # layer 2: 6.125 -> 6.0.
    comp = [0.25, 1.5, 1.25]
    blocks = [3, 4, 5]
    before = np.array([[0, 1, 0], [1, 1, 0], [1, 0, 1]], dtype=np.bool_)
    after = np.array([[0, 1, 0], [0, 1, 0], [1, 0, 1]], dtype=np.bool_)
    slow = StepInputs.of(comp, blocks, before, 4.0)
    fast = StepInputs.of(comp, blocks, after, 4.0)
    assert _latency(slow) == pytest.approx(6.125)
    assert _latency(fast) == pytest.approx(6.0)
    assert _brute(slow, DT_S) - _brute(fast, DT_S) > 0.1


def test_anomaly_more_bandwidth_can_be_slower() -> None:
    # With more bandwidth request 0's layer-2 fetch (12.15 blocks) lands
    # earlier, layer 2 ends earlier and request 0's layer-5 fetch is released
    # earlier, into the window where request 1's small layer-3 fetch is still
    # in flight; layer 3 starts later and the step ends later.
    comp = [3.7, 0.25, 4.75, 0.05, 0.1, 0.05, 1.5]
    blocks = [12.15, 0.95, 0.35]
    resident = np.array(
        [
            [1, 0, 1, 1, 0, 1, 1],
            [0, 1, 0, 0, 1, 1, 0],
            [0, 1, 1, 1, 0, 0, 1],
        ],
        dtype=np.bool_,
    )
    slow = StepInputs.of(comp, blocks, resident, 2.95)
    fast = StepInputs.of(comp, blocks, resident, 3.0)
    gap = _latency(fast) - _latency(slow)
    assert gap == pytest.approx(0.0181, abs=1e-4)
    assert _brute(fast, 2e-4) - _brute(slow, 2e-4) > gap / 2
