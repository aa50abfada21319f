"""Per-server producer-consumer matching: stable (no blocking pair, checked
by brute force on random servers), one-to-one, DRAM fallback, headroom."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from planner.domain.placement import MatchGpu
from planner.policies.aqua.matching import blocking_pairs, match_server

GB = 10**9


def test_best_fit_pairs_and_dram_fallback():
    gpus = [
        MatchGpu("p-big", spare_bytes=40 * GB, link_gbps=300),
        MatchGpu("p-small", spare_bytes=10 * GB, link_gbps=300),
        MatchGpu("c-big", demand_bytes=30 * GB, link_gbps=300, paging_gbps=50),
        MatchGpu("c-small", demand_bytes=8 * GB, link_gbps=200, paging_gbps=20),
        MatchGpu("c-extra", demand_bytes=5 * GB, link_gbps=300),
    ]
    m = match_server(gpus)
    pairs = {p.consumer_id: p for p in m.pairs}
    assert pairs["c-big"].producer_id == "p-big"
    assert pairs["c-small"].producer_id == "p-small"
    assert pairs["c-big"].covered_bytes == 30 * GB and pairs["c-big"].dram_bytes == 0
    assert pairs["c-big"].headroom_gbps == 250
    assert pairs["c-small"].headroom_gbps == 180
    assert m.dram_consumers == ("c-extra",)
    assert m.idle_producers == ()
    assert blocking_pairs(gpus, m) == []


def test_partial_cover_pages_the_rest_to_dram():
    gpus = [MatchGpu("p", spare_bytes=10 * GB), MatchGpu("c", demand_bytes=25 * GB)]
    (pair,) = match_server(gpus).pairs
    assert pair.covered_bytes == 10 * GB and pair.dram_bytes == 15 * GB


GPU = st.tuples(st.booleans(), st.integers(1, 12))


@settings(max_examples=150, deadline=None)
@given(st.lists(GPU, min_size=0, max_size=9))
def test_matching_is_stable_and_one_to_one(spec):
    gpus = [
        MatchGpu(f"g{i}", spare_bytes=size * GB)
        if prod
        else MatchGpu(f"g{i}", demand_bytes=size * GB)
        for i, (prod, size) in enumerate(spec)
    ]
    m = match_server(gpus)
    producers = [p.producer_id for p in m.pairs]
    consumers = [p.consumer_id for p in m.pairs]
    assert len(set(producers)) == len(producers) and len(set(consumers)) == len(consumers)
    assert blocking_pairs(gpus, m) == []
    n_prod = sum(1 for p, _ in spec if p)
    n_cons = len(spec) - n_prod
    # Every GPU ranks every one of the other side, so the matching is maximal.
    assert len(m.pairs) == min(n_prod, n_cons)
    assert len(m.dram_consumers) == n_cons - len(m.pairs)
