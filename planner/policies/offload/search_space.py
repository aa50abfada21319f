"""Candidate per-request offload patterns (DESIGN.md §3.2 "Search space";
OrbitFlow §3.3.2).

PRUNED (the paper's): a request picks a distance k in {2..L} and offloads the
layers l with l mod k == 0 (1-indexed); distances with the same count
floor(L/k) are collapsed into one, so there are D(L) <= 2*floor(sqrt(L)) - 1
patterns, plus "nothing offloaded". Of the distances sharing a count we keep
the largest, k = floor(L/c): it spaces the fetches widest and leaves the most
compute before each one to overlap with it.

PERIODIC (the non-pruned mode, to measure what pruning costs): every distance
k in {1..L} with every phase (offload l = p, p+k, p+2k, ... for p in 1..k), not
collapsed, plus for every count c in 1..L the evenly spread pattern
l_i = ceil(i*L/c), i = 1..c (which reaches the counts between L/2 and L that
no distance gives), plus nothing. L(L+1)/2 + L + 1 patterns before
deduplication: 529 + 33 for L = 32.

EXHAUSTIVE: all 2^L patterns, for L <= 16 only (a reference for small models).

Patterns are deduplicated (the first generated keeps its distance) and listed
by offloaded count, then in generation order.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

BoolArray = npt.NDArray[np.bool_]
IntArray = npt.NDArray[np.int64]

MAX_EXHAUSTIVE_LAYERS = 16


class SearchMode(enum.StrEnum):
    PRUNED = "pruned"
    PERIODIC = "periodic"
    EXHAUSTIVE = "exhaustive"


@dataclass(frozen=True, slots=True)
class OffloadCandidates:
    """C candidate patterns for one request.

    offloaded: (C, L) True where the layer is fetched from CPU (x = 0).
    distance: (C,) the distance k that generated the pattern, 0 when none did
        (nothing offloaded, evenly spread or exhaustive patterns).
    count: (C,) offloaded layers.
    """

    offloaded: BoolArray
    distance: IntArray
    count: IntArray

    def __len__(self) -> int:
        return int(self.count.size)

    @property
    def resident(self) -> BoolArray:
        """(C, L) x: True where the layer stays on GPU."""
        resident: BoolArray = ~self.offloaded
        return resident


def pruned_choice_count(num_layers: int) -> int:
    """D(L) = |{floor(L/k) : k = 2..L}|, not counting "nothing offloaded"."""
    return len({num_layers // k for k in range(2, num_layers + 1)})


def pruned_choice_bound(num_layers: int) -> int:
    """The paper's bound 2*floor(sqrt(L)) - 1 on D(L)."""
    return 2 * math.isqrt(num_layers) - 1


def candidate_patterns(
    num_layers: int, mode: SearchMode | str = SearchMode.PRUNED
) -> OffloadCandidates:
    """The offload patterns one request may pick from, in `mode`."""
    if num_layers < 0:
        raise ValueError(f"num_layers must be >= 0, got {num_layers}")
    if num_layers == 0:
        empty = np.zeros((1, 0), dtype=np.bool_)
        return OffloadCandidates(empty, np.zeros(1, dtype=np.int64), np.zeros(1, dtype=np.int64))
    layers = np.arange(1, num_layers + 1)
    patterns: list[tuple[BoolArray, int]] = [(np.zeros(num_layers, dtype=np.bool_), 0)]
    match SearchMode(mode):
        case SearchMode.PRUNED:
            widest: dict[int, int] = {}
            for k in range(2, num_layers + 1):
                widest[num_layers // k] = k
            for k in sorted(widest.values(), reverse=True):
                patterns.append((layers % k == 0, k))
        case SearchMode.PERIODIC:
            for k in range(1, num_layers + 1):
                for phase in range(1, k + 1):
                    patterns.append(((layers >= phase) & ((layers - phase) % k == 0), k))
            for count in range(1, num_layers + 1):
                spread = np.zeros(num_layers, dtype=np.bool_)
                spread[-(-np.arange(1, count + 1) * num_layers // count) - 1] = True
                patterns.append((spread, 0))
        case SearchMode.EXHAUSTIVE:
            if num_layers > MAX_EXHAUSTIVE_LAYERS:
                raise ValueError(
                    f"exhaustive search is limited to {MAX_EXHAUSTIVE_LAYERS} layers "
                    f"(2^{num_layers} patterns asked)"
                )
            codes = np.arange(1, 1 << num_layers)
            bits = (codes[:, None] >> np.arange(num_layers)) & 1
            patterns.extend((row, 0) for row in bits.astype(np.bool_))
    return _dedup_by_count(patterns, num_layers)


def _dedup_by_count(patterns: list[tuple[BoolArray, int]], num_layers: int) -> OffloadCandidates:
    offloaded = np.array([p for p, _ in patterns], dtype=np.bool_).reshape(-1, num_layers)
    distance = np.array([k for _, k in patterns], dtype=np.int64)
    _, first = np.unique(np.packbits(offloaded, axis=1), axis=0, return_index=True)
    kept = np.sort(first)
    order = kept[np.argsort(offloaded[kept].sum(axis=1), kind="stable")]
    return OffloadCandidates(
        offloaded=offloaded[order],
        distance=distance[order],
        count=offloaded[order].sum(axis=1).astype(np.int64),
    )
