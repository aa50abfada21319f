"""Serverless per-request choices (C2CServe §6.1, §6.3, §6.4): routing to an
active / idle slice or an eviction, chunk size at the table's boundaries,
kernel family; and the profiles they read (Table 1, the C2C cost model)."""

from __future__ import annotations

import itertools

import pytest

from planner.domain.serverless import ServerlessModel, SliceState
from planner.policies.serverless import (
    ACTIVE,
    EVICT,
    IDLE,
    QUEUE,
    choose_chunk,
    choose_kernel,
    route_request,
)
from planner.profiles import MODEL_PROFILES
from planner.profiles.c2c_cost import (
    ChunkRow,
    chunk_table,
    gemm_cost,
    required_c2c_gbps,
)
from planner.profiles.mig import GH200_C2C_LINK, MIG_PROFILES, find_mig_profile, mig_layout

GB = 10**9
P = MIG_PROFILES
LINK = GH200_C2C_LINK.sustained_gbps
LLAMA8 = MODEL_PROFILES["llama-3-8b"]


# --- profiles ----------------------------------------------------------------


def test_table_1_profiles():
    rows = {n: (p.instances, p.hbm_bytes // GB, p.sms, p.hbm_gbps) for n, p in MIG_PROFILES.items()}
    assert rows == {
        "gh200-1x96gb": (1, 96, 132, 4000.0),
        "gh200-2x48gb": (2, 48, 56, 2000.0),
        "gh200-3x24gb": (3, 24, 28, 1000.0),
        "gh200-4x24gb": (4, 24, 16, 1000.0),
        "gh200-7x12gb": (7, 12, 16, 500.0),
    }
    assert find_mig_profile("7") is find_mig_profile("7x12gb") is P["gh200-7x12gb"]
    assert len(mig_layout("3")) == 3
    assert GH200_C2C_LINK.peak_gbps == 450.0


def test_hybrid_gemm_cost_reproduces_the_papers_fig_4_trend():
    def both(name):
        sym = gemm_cost(6144, 8192, 8192, rho=1.0, mig=P[name], c2c_gbps=LINK)
        asym = gemm_cost(6144, 8192, 8192, rho=0.0, mig=P[name], c2c_gbps=LINK)
        return sym, asym

    sym, asym = both("gh200-1x96gb")  # paper: 16.4 ms vs 4.0 ms
    assert sym.bound == "c2c" and asym.bound == "hbm"
    assert sym.time_s == pytest.approx(0.0159, rel=0.05)
    assert asym.time_s < sym.time_s / 3
    sym7, asym7 = both("gh200-7x12gb")  # asymmetric slower with 7 instances
    assert asym7.time_s > sym7.time_s
    # rho trades C2C for HBM traffic monotonically.
    costs = [
        gemm_cost(2048, 4096, 4096, rho=r, mig=P["gh200-3x24gb"], c2c_gbps=LINK)
        for r in (0, 0.5, 1)
    ]
    assert costs[0].c2c_bytes < costs[1].c2c_bytes < costs[2].c2c_bytes
    assert costs[0].hbm_bytes > costs[1].hbm_bytes > costs[2].hbm_bytes


def test_required_bandwidth_is_weights_over_tpot():
    assert required_c2c_gbps(16e9, 0.1) == pytest.approx(160.0)


def test_derived_chunk_table_trades_ttft_for_burst():
    table = chunk_table(LLAMA8, P["gh200-7x12gb"], prompt_tokens=2048, c2c_gbps=LINK / 7)
    assert [r.chunk_tokens for r in table] == [128, 256, 512, 1024, 2048, 4096, 8192]
    ttft = [r.ttft_s for r in table]
    # Each chunk re-streams the weights: fewer chunks, lower TTFT ...
    assert all(a >= b - 1e-12 for a, b in itertools.pairwise(ttft))
    # ... while a single larger chunk runs longer on the link (a longer burst).
    assert table[0].chunks == 16 and table[4].chunks == 1
    assert table[4].chunk_time_s > table[0].chunk_time_s


# --- chunk choice ------------------------------------------------------------


def row(chunk, ttft, hbm_bytes=0.0, flops=0.0):
    return ChunkRow(chunk, 1, ttft, 0.0, hbm_bytes, flops, ttft, 10.0)


TABLE = [row(256, 2.0), row(512, 1.0), row(1024, 0.6), row(2048, 0.5)]
SMALL = P["gh200-7x12gb"]


@pytest.mark.parametrize(
    ("target", "chunk", "meets"),
    [
        (5.0, 256, True),  # above every row: the smallest chunk
        (2.0, 256, True),  # exactly the first row's TTFT (<= counts)
        (1.999, 512, True),  # just below it: the next row
        (1.0, 512, True),
        (0.6, 1024, True),
        (0.5, 2048, True),  # exactly the last row
        (0.499, 2048, False),  # below every row: the fastest, flagged
    ],
)
def test_chunk_choice_at_the_table_boundaries(target, chunk, meets):
    choice = choose_chunk(TABLE, ttft_target_s=target, mig=SMALL)
    assert (choice.chunk_tokens, choice.meets_target) == (chunk, meets)


def test_chunk_choice_respects_the_slice_hbm_bandwidth_and_compute():
    hbm_cap = SMALL.hbm_bytes_per_s  # bytes/s
    table = [
        row(256, 0.9, hbm_bytes=2.0 * hbm_cap),  # needs 2x the slice's HBM over 1 s
        row(512, 0.8, flops=10 * SMALL.compute_flops_per_s),  # 10x its compute
        row(1024, 0.7, hbm_bytes=0.5 * hbm_cap),
    ]
    choice = choose_chunk(table, ttft_target_s=1.0, mig=SMALL)
    assert choice.chunk_tokens == 1024 and choice.meets_target
    assert choice.hbm_gbps_needed == pytest.approx(0.5 * hbm_cap / GB)


def test_chunk_choice_rejects_empty_tables_and_bad_targets():
    with pytest.raises(ValueError, match="empty"):
        choose_chunk([], ttft_target_s=1.0, mig=SMALL)
    with pytest.raises(ValueError, match="ttft_target_s"):
        choose_chunk(TABLE, ttft_target_s=0.0, mig=SMALL)


def test_chunk_from_the_cost_model_is_smaller_on_a_looser_target():
    table = chunk_table(LLAMA8, SMALL, prompt_tokens=4096, c2c_gbps=LINK / 7)
    tight = choose_chunk(table, ttft_target_s=table[-1].ttft_s * 1.01, mig=SMALL)
    loose = choose_chunk(table, ttft_target_s=table[0].ttft_s * 1.01, mig=SMALL)
    assert loose.chunk_tokens == 128 and tight.chunk_tokens > loose.chunk_tokens


# --- kernel choice -----------------------------------------------------------


def test_kernel_family_by_precision_shape_and_slice():
    d = choose_kernel(precision="bf16", tokens=8, mig=P["gh200-1x96gb"])
    assert (d.shape, d.asym_block_k, d.initial_rho) == ("decode", 256, 0.0)
    assert d.family == "hybrid_gemm.bf16.decode.m64n256k256"
    p = choose_kernel(precision="fp8", tokens=2048, mig=P["gh200-7x12gb"])
    assert (p.shape, p.precision, p.asym_block_k) == ("prefill", "fp8", 512)
    with pytest.raises(ValueError, match="precision"):
        choose_kernel(precision="int3", tokens=8, mig=SMALL)


def test_kernel_reports_the_cost_models_static_rho():
    # On the full GPU with the whole link, a large prefill is C2C-bound at
    # rho = 1 and HBM-light at rho = 0: the best rho is small; on a 7-way
    # slice with its 1/7 link share HBM binds and the best rho is larger.
    big = choose_kernel(
        precision="bf16", tokens=4096, mig=P["gh200-1x96gb"], model=LLAMA8, c2c_gbps=LINK
    )
    small = choose_kernel(
        precision="bf16", tokens=4096, mig=P["gh200-7x12gb"], model=LLAMA8, c2c_gbps=LINK
    )
    assert 0.0 <= big.model_best_rho < small.model_best_rho <= 1.0
    assert big.initial_rho == small.initial_rho == 0.0


# --- routing -----------------------------------------------------------------


def m(name, gbps, **kw):
    # weight bytes chosen so that c2c_gbps == gbps at TPOT 0.1 s
    return ServerlessModel(name, int(gbps * 0.1 * GB), 0.1, **kw)


def sl(id_, profile="gh200-4x24gb", model="", gbps=0.0, prio=0.0, in_flight=0, last=0.0):
    return SliceState(id_, P[profile], model, gbps, prio, in_flight, last)


BUDGET = 364.5


def test_routes_to_the_least_loaded_active_slice():
    slices = [sl("a", model="x", gbps=50, in_flight=3), sl("b", model="x", gbps=50, in_flight=1)]
    d = route_request(m("x", 50), slices, priority=1, link_budget_gbps=BUDGET)
    assert (d.action, d.slice_id) == (ACTIVE, "b")


def test_idle_slice_smallest_that_fits_within_the_link():
    slices = [
        sl("big", "gh200-2x48gb"),
        sl("small", "gh200-7x12gb"),
        sl("busy", model="y", gbps=100, in_flight=1),
    ]
    d = route_request(m("x", 100), slices, priority=1, link_budget_gbps=BUDGET)
    assert (d.action, d.slice_id) == (IDLE, "small")
    assert d.link_demand_gbps == pytest.approx(200)
    # Needs 20 GB of HBM: only the 48 GB slice holds it.
    d = route_request(m("x", 100, hbm_bytes=20 * GB), slices, priority=1, link_budget_gbps=BUDGET)
    assert d.slice_id == "big"


def test_idle_slice_over_the_link_budget_triggers_eviction_of_lru_inactive():
    slices = [
        sl("idle"),
        sl("a", model="old", gbps=150, last=5.0),
        sl("b", model="older", gbps=150, last=2.0),
        sl("c", model="busy", gbps=50, in_flight=2),
    ]
    # 350 + 100 > 364.5: the idle slice cannot take it without an eviction.
    d = route_request(m("x", 100), slices, priority=1, link_budget_gbps=BUDGET)
    assert (d.action, d.slice_id, d.evicted_model) == (EVICT, "b", "older")
    assert d.link_demand_gbps == pytest.approx(300)


def test_evicts_lower_priority_active_model_only_when_no_inactive_one():
    slices = [
        sl("a", model="p5", gbps=100, prio=5, in_flight=1),
        sl("b", model="p1", gbps=100, prio=1, in_flight=4),
        sl("c", model="p2", gbps=100, prio=2, in_flight=1),
    ]
    d = route_request(m("x", 100), slices, priority=3, link_budget_gbps=BUDGET)
    assert (d.action, d.slice_id, d.evicted_model) == (EVICT, "b", "p1")
    # Equal or lower request priority: queue; likewise with preemption off.
    q = route_request(m("x", 100), slices, priority=1, link_budget_gbps=BUDGET)
    assert q.action == QUEUE and "busy" in q.reason
    q = route_request(m("x", 100), slices, priority=3, link_budget_gbps=BUDGET, allow_preempt=False)
    assert q.action == QUEUE


def test_queue_names_why():
    slices = [sl("a", "gh200-7x12gb")]
    q = route_request(m("x", 500), slices, priority=1, link_budget_gbps=BUDGET)
    assert q.action == QUEUE and "over the budget" in q.reason
    q = route_request(m("x", 10, hbm_bytes=50 * GB), slices, priority=1, link_budget_gbps=BUDGET)
    assert q.action == QUEUE and "fits no slice" in q.reason
