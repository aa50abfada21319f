"""The placer's memory phase: with max_s |eq_s| held at a cap (the least
one, from placer_patterns.py), lower max_s |mem_s| by re-splitting pairs of
servers.

Each step takes a server at the max and, for every other server, the best
split of the two servers' models between them (every subset, at most
MAX_PAIR_MODELS models) that fits both servers' GPUs and keeps both |eq| at
most the cap; it applies the split that lowers the pair's larger |mem| most.
A pair re-split moves several models at once, which single moves and swaps
cannot. When no pair lowers the max, a random pair of other servers is
re-split at random among the splits that keep both under the max (a walk
on the plateau), then the search goes on, until a floor, a deadline or
STALL_STEPS_PER_SERVER steps per server without a new best; the best
placement seen is kept.
Balanced min-max partitions with a few models per server and many servers
are in the easy regime of number partitioning: many placements reach the
mean, and this finds one of them in a few hundred steps."""

from __future__ import annotations

import math
import random
import time
from collections.abc import Sequence
from functools import cache

import numpy as np
import numpy.typing as npt

from planner.domain.placement import PlacementInputs

MB = 10**6
MAX_PAIR_MODELS = 12
# The search gives up after this many steps per server without a new best
# (two servers: at once, one re-split of the pair is exhaustive).
STALL_STEPS_PER_SERVER = 50
IntArray = npt.NDArray[np.int64]


def _sign(r: int) -> int:
    return (r > 0) - (r < 0)


@cache
def _subsets(k: int) -> IntArray:
    """2^k x k: row b is the bits of b (1 = the model goes to the first server)."""
    b = np.arange(1 << k, dtype=np.int64)[:, None]
    return (b >> np.arange(k, dtype=np.int64)) & 1


class _State:
    def __init__(self, inputs: PlacementInputs, servers: Sequence[int]) -> None:
        models = inputs.models
        self.g = inputs.gpus_per_server
        self.r = np.array([round(m.r_bytes / MB) for m in models], dtype=np.int64)
        self.w = np.array([m.shards * _sign(round(m.r_bytes / MB)) for m in models], dtype=np.int64)
        self.sh = np.array([m.shards for m in models], dtype=np.int64)
        self.cur = np.array(servers, dtype=np.int64)
        s_count = inputs.num_servers
        self.members: list[list[int]] = [[] for _ in range(s_count)]
        for i, s in enumerate(servers):
            self.members[s].append(i)
        self.mem = np.bincount(self.cur, weights=self.r, minlength=s_count).astype(np.int64)
        self.eq = np.bincount(self.cur, weights=self.w, minlength=s_count).astype(np.int64)

    def splits(self, a: int, b: int, cap: int) -> tuple[list[int], IntArray, IntArray] | None:
        """The models of servers a and b, the feasible subset rows (models
        to a), and max(|mem_a|, |mem_b|) of each; None when too many."""
        both = self.members[a] + self.members[b]
        if len(both) > MAX_PAIR_MODELS:
            return None
        bits = _subsets(len(both))
        idx = np.array(both, dtype=np.int64)
        sh, r, w = self.sh[idx], self.r[idx], self.w[idx]
        used_a = bits @ sh
        mem_a, eq_a = bits @ r, bits @ w
        mem_b, eq_b = r.sum() - mem_a, w.sum() - eq_a
        ok = (
            (used_a <= self.g)
            & (sh.sum() - used_a <= self.g)
            & (np.abs(eq_a) <= cap)
            & (np.abs(eq_b) <= cap)
        )
        rows = np.flatnonzero(ok)
        return both, bits[rows], np.maximum(np.abs(mem_a[rows]), np.abs(mem_b[rows]))

    def apply(self, a: int, b: int, both: list[int], row: IntArray) -> None:
        self.members[a] = [i for i, bit in zip(both, row, strict=True) if bit]
        self.members[b] = [i for i, bit in zip(both, row, strict=True) if not bit]
        for s in (a, b):
            ids = np.array(self.members[s], dtype=np.int64)
            self.cur[ids] = s
            self.mem[s] = int(self.r[ids].sum()) if ids.size else 0
            self.eq[s] = int(self.w[ids].sum()) if ids.size else 0


def balance_memory(
    inputs: PlacementInputs,
    servers: Sequence[int],
    cap: int,
    floor_mb: int,
    deadline: float,
    *,
    seed: int = 0,
) -> list[int]:
    """A placement with max |eq| <= cap (servers must already meet it) and
    max |mem| (whole MB) as low as the search gets by `deadline`, stopping
    early at floor_mb (a lower bound). Never worse than `servers`."""
    state = _State(inputs, servers)
    s_count = inputs.num_servers
    rng = random.Random(seed)
    best = state.cur.copy()
    best_max = int(np.abs(state.mem).max(initial=0))
    if s_count < 2:
        return [int(s) for s in best]
    stall, stall_limit = 0, 0 if s_count == 2 else STALL_STEPS_PER_SERVER * s_count
    while best_max > floor_mb and time.perf_counter() < deadline:
        top = int(np.abs(state.mem).max(initial=0))
        at_max = np.flatnonzero(np.abs(state.mem) == top)
        a = int(at_max[rng.randrange(at_max.size)])
        chosen: tuple[int, int, list[int], IntArray] | None = None
        # A pair's larger |mem| is at least half its total: partners in order
        # of that bound, stopping where it cannot beat the best split found.
        pair_total = np.abs(state.mem + state.mem[a])
        for b in np.argsort(pair_total, kind="stable").tolist():
            if (int(pair_total[b]) + 1) // 2 >= (top if chosen is None else chosen[0]):
                break
            if b == a:
                continue
            got = state.splits(a, b, cap)
            if got is None or got[2].size == 0:
                continue
            both, rows, pair_max = got
            k = int(pair_max.argmin())
            if pair_max[k] < top and (chosen is None or pair_max[k] < chosen[0]):
                chosen = (int(pair_max[k]), b, both, rows[k])
        if chosen is not None:
            state.apply(a, chosen[1], chosen[2], chosen[3])
        elif stall >= stall_limit:
            break
        else:
            _walk(state, rng, a, top, cap)
        now_max = int(np.abs(state.mem).max(initial=0))
        stall += 1
        if now_max < best_max:
            best, best_max, stall = state.cur.copy(), now_max, 0
    return [int(s) for s in best]


def _walk(state: _State, rng: random.Random, a: int, top: int, cap: int) -> None:
    """Re-split a random pair: a with another server, or two others, at
    random among the splits that keep both at most `top`."""
    s_count = len(state.members)
    b = rng.randrange(s_count)
    c = a if rng.random() < 0.5 else rng.randrange(s_count)
    if b == c:
        return
    got = state.splits(b, c, cap)
    if got is None:
        return
    both, rows, pair_max = got
    ok = np.flatnonzero(pair_max <= top)
    if ok.size:
        state.apply(b, c, both, rows[ok[rng.randrange(ok.size)]])


def mem_floor_mb(inputs: PlacementInputs) -> int:
    """A lower bound on max_s |mem_s| in whole MB: at least the mean
    |sum R| / S, and a multiple of the gcd of the requirements (every mem_s
    is one)."""
    r = [round(m.r_bytes / MB) for m in inputs.models]
    step = math.gcd(*r) or 1
    mean = -(-abs(sum(r)) // inputs.num_servers)
    return -(-mean // step) * step
