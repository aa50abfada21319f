"""Candidate offload patterns (DESIGN.md §3.2 "Search space"; OrbitFlow
§3.3.2)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from planner.policies.offload import (
    SearchMode,
    candidate_patterns,
    pruned_choice_bound,
    pruned_choice_count,
)


def offloaded_layers(num_layers: int, mode: SearchMode = SearchMode.PRUNED) -> list[list[int]]:
    """Each candidate's offloaded layers, 1-indexed."""
    candidates = candidate_patterns(num_layers, mode)
    return [(np.flatnonzero(row) + 1).tolist() for row in candidates.offloaded]


def test_pruned_nine_layers() -> None:
    # floor(9/k) for k = 2..9 is 4, 3, 2, 1, 1, 1, 1, 1: four counts. Count 1 is
    # reached by k = 5..9; the widest, k = 9, offloads layer 9.
    candidates = candidate_patterns(9)
    assert offloaded_layers(9) == [[], [9], [4, 8], [3, 6, 9], [2, 4, 6, 8]]
    assert candidates.distance.tolist() == [0, 9, 4, 3, 2]
    assert candidates.count.tolist() == [0, 1, 2, 3, 4]
    assert (candidates.resident == ~candidates.offloaded).all()


def test_pruned_thirty_two_layers() -> None:
    # The paper: "with L = 32 ... we have D(32) = 9 possible KV placements".
    candidates = candidate_patterns(32)
    assert pruned_choice_count(32) == 9
    assert len(candidates) == 9 + 1
    assert candidates.count.tolist() == [0, 1, 2, 3, 4, 5, 6, 8, 10, 16]
    assert candidates.distance.tolist() == [0, 32, 16, 10, 8, 6, 5, 4, 3, 2]
    layers = offloaded_layers(32)
    assert layers[1] == [32]
    assert layers[3] == [10, 20, 30]
    assert layers[-1] == list(range(2, 33, 2))


@given(st.integers(1, 200))
def test_pruned_count_bound(num_layers: int) -> None:
    candidates = candidate_patterns(num_layers)
    d = pruned_choice_count(num_layers)
    assert d <= pruned_choice_bound(num_layers) == 2 * math.isqrt(num_layers) - 1
    assert len(candidates) == d + 1
    assert len(np.unique(candidates.offloaded, axis=0)) == len(candidates)
    # Every pattern is the distance rule l mod k == 0 for its k.
    layers = np.arange(1, num_layers + 1)
    for row, k in zip(candidates.offloaded[1:], candidates.distance[1:], strict=True):
        assert (row == (layers % k == 0)).all()
        assert row.sum() == num_layers // k


def test_one_layer_has_only_nothing() -> None:
    assert offloaded_layers(1) == [[]]
    assert offloaded_layers(0) == [[]]
    assert offloaded_layers(1, SearchMode.PERIODIC) == [[], [1]]


def test_periodic_small_case() -> None:
    # L = 4, generated as: k = 1: [1,2,3,4]; k = 2: [1,3], [2,4]; k = 3: [1,4],
    # [2], [3]; k = 4: [1], ([2], [3] again), [4]; spread counts 1..4: [4],
    # [2,4], [2,3,4] (ceil(4/3), ceil(8/3), 4), [1,2,3,4]. Duplicates dropped,
    # then ordered by count, generation order within a count.
    candidates = candidate_patterns(4, SearchMode.PERIODIC)
    assert offloaded_layers(4, SearchMode.PERIODIC) == [
        [],
        [2],
        [3],
        [1],
        [4],
        [1, 3],
        [2, 4],
        [1, 4],
        [2, 3, 4],
        [1, 2, 3, 4],
    ]
    assert candidates.distance.tolist() == [0, 3, 3, 4, 4, 2, 2, 3, 0, 1]


@given(st.integers(1, 40))
def test_periodic_contains_pruned_and_every_count(num_layers: int) -> None:
    pruned = candidate_patterns(num_layers)
    periodic = candidate_patterns(num_layers, "periodic")
    rows = {row.tobytes() for row in periodic.offloaded}
    assert all(row.tobytes() in rows for row in pruned.offloaded)
    assert set(periodic.count.tolist()) == set(range(num_layers + 1))
    assert len(rows) == len(periodic)
    assert (np.diff(periodic.count) >= 0).all()


def test_periodic_size_for_32_layers() -> None:
    # At most 32*33/2 distance-and-phase patterns + 32 spread ones + nothing.
    assert len(candidate_patterns(32, SearchMode.PERIODIC)) <= 528 + 32 + 1


def test_exhaustive() -> None:
    candidates = candidate_patterns(4, SearchMode.EXHAUSTIVE)
    assert len(candidates) == 16
    assert candidates.count.tolist() == sorted(candidates.count.tolist())
    with pytest.raises(ValueError):
        candidate_patterns(17, SearchMode.EXHAUSTIVE)


def test_deterministic() -> None:
    for mode in SearchMode:
        a = candidate_patterns(12, mode)
        b = candidate_patterns(12, mode)
        assert (a.offloaded == b.offloaded).all()
        assert (a.distance == b.distance).all()


def test_bad_arguments() -> None:
    with pytest.raises(ValueError):
        candidate_patterns(-1)
    with pytest.raises(ValueError):
        candidate_patterns(8, "greedy")
