"""The timing loop: warm up, then time each call with perf_counter_ns."""

from __future__ import annotations

import gc
import math
import time
from collections.abc import Callable

from planner.bench.stats import LatencyStats, summarize

# With a time budget, never fewer timed calls than this (a p99 needs a few
# samples above it).
MIN_CALLS = 200
MIN_WARMUP = 3


def default_calls(num_requests: int) -> int:
    """Timed calls per case: many where calls are cheap, enough for a p99
    everywhere (2000 up to 100 requests, 1000 up to 1,000, 200 beyond)."""
    if num_requests <= 100:
        return 2000
    if num_requests <= 1000:
        return 1000
    return 200


def default_warmup(calls: int) -> int:
    return max(calls // 10, MIN_WARMUP)


def time_calls(
    fn: Callable[[], object], calls: int, warmup: int, budget_s: float | None = None
) -> LatencyStats:
    """Latency of fn() over `calls` calls after `warmup` untimed ones.

    budget_s bounds a slow case: the warm-up stops after a tenth of it (at
    least MIN_WARMUP calls), and the timed calls are cut to what the budget
    holds at the warm-up's pace, but to no fewer than MIN_CALLS.

    The garbage collector stays on (a serving process runs with it), but a
    collection is forced before timing so one case does not pay for the
    garbage of the previous one.
    """
    if calls <= 0:
        raise ValueError(f"calls must be > 0, got {calls}")
    clock = time.perf_counter_ns
    started = clock()
    done = 0
    while done < warmup:
        fn()
        done += 1
        spent_s = (clock() - started) / 1e9
        if budget_s is not None and done >= MIN_WARMUP and spent_s > budget_s / 10:
            break
    if budget_s is not None and done:
        per_call_s = (clock() - started) / 1e9 / done
        if per_call_s > 0:
            calls = min(calls, max(MIN_CALLS, math.floor(budget_s / per_call_s)))
    gc.collect()
    samples = [0] * calls
    for i in range(calls):
        start = clock()
        fn()
        samples[i] = clock() - start
    return summarize(samples)
