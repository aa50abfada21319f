"""What one policy's replay run amounts to: SLO attainment, latency
percentiles, throughput, preemption and transfer counters.

Definitions (times in simulated seconds; "the request's SLO" is its own
``slo_ttft_s`` / ``slo_tbt_s``, so SLOs may differ per request):

- **TTFT** = ``token_times_s[0] - arrival_s``. Attained when TTFT <= the
  request's ``slo_ttft_s``. A request that never produced a token has no
  TTFT and counts as *not* attained. TTFT attainment = attained / all
  requests.
- **TBT samples** are the gaps between consecutive token times of a request
  (every request's gaps, finished or not). **Token-level TBT attainment** =
  fraction of all gaps <= the owning request's ``slo_tbt_s``.
- **TPOT** of a finished request with >= 2 tokens =
  ``(token_times_s[-1] - token_times_s[0]) / (tokens - 1)``. A request's TPOT
  is attained when TPOT <= its ``slo_tbt_s``; a finished request with fewer
  than two tokens counts as attained, an unfinished request as not attained.
  **Request-level TPOT attainment** = attained / all requests.
- **Both-attained** = TTFT attained and TPOT attained (so finished), over
  all requests.
- **Throughput** = output tokens produced (``len(token_times_s)`` summed over
  all requests, unfinished included) / the simulated span, which runs from
  the first arrival to the last finish (or the last token, if a run cut short
  produced one later). Requests/s = finished requests / the same span.
- **Percentiles** p50/p90/p99 (plus mean and max) of TTFT (requests with a
  first token), TBT (all gaps) and TPOT (finished requests with >= 2 tokens),
  numpy's linear interpolation between order statistics.
- Counters come from :class:`ReplayTotals`: preemptions, swap-outs,
  swap-ins, bytes device->host and host->device, stall time (total and as a
  fraction of simulated time), peak GPU KV blocks used (and as a fraction of
  the pool), iterations and simulated seconds per wall-clock second.
  ``recomputed_tokens`` is summed over the requests.
- **Prefix-cache hit rate** = prompt tokens found in the prefix cache when
  each request first started / the prompt tokens of the requests that
  started (a restart after a preemption is not counted again); ``None``
  without a prefix cache.

Every comparison with an SLO allows :data:`SLO_TOLERANCE_S` (1 ns) for float
rounding in the simulator's clock. A fraction whose denominator is zero (no
requests, no gaps, no wall time) is ``None``, as are the percentiles of an
empty sample.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, fields
from typing import Any, Protocol, TypeVar

import numpy as np
from numpy.typing import NDArray

from planner.replay.records import ReplayResult, RequestOutcome

SLO_TOLERANCE_S = 1e-9
PERCENTILES = (50.0, 90.0, 99.0)

FloatArray = NDArray[np.float64]
BoolArray = NDArray[np.bool_]


@dataclass(frozen=True, slots=True)
class Distribution:
    """Summary of a latency sample, in seconds; all None when count == 0."""

    count: int
    mean: float | None
    p50: float | None
    p90: float | None
    p99: float | None
    max: float | None

    @staticmethod
    def of(samples: FloatArray) -> Distribution:
        if samples.size == 0:
            return Distribution(0, None, None, None, None, None)
        p50, p90, p99 = (float(v) for v in np.percentile(samples, PERCENTILES))
        return Distribution(
            count=int(samples.size),
            mean=float(samples.mean()),
            p50=p50,
            p90=p90,
            p99=p99,
            max=float(samples.max()),
        )

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @staticmethod
    def from_json(data: dict[str, Any]) -> Distribution:
        def opt(key: str) -> float | None:
            value = data[key]
            return None if value is None else float(value)

        return Distribution(
            count=int(data["count"]),
            mean=opt("mean"),
            p50=opt("p50"),
            p90=opt("p90"),
            p99=opt("p99"),
            max=opt("max"),
        )


@dataclass(frozen=True, slots=True)
class LatencySamples:
    """Per-request and per-gap latencies of one run, for metrics and plots.

    Per-request arrays have one entry per request, in the order of
    ``ReplayResult.requests``; ``ttft_s`` is NaN where no token came.
    """

    ttft_s: FloatArray
    ttft_attained: BoolArray
    slo_ttft_s: FloatArray
    tbt_s: FloatArray
    tbt_attained: BoolArray
    # The SLO of the request each gap belongs to.
    tbt_slo_s: FloatArray
    # Only finished requests with >= 2 tokens, in request order.
    tpot_s: FloatArray
    tpot_attained: BoolArray
    finished: BoolArray
    tokens: NDArray[np.int64]
    span_s: float


def latency_samples(requests: Sequence[RequestOutcome]) -> LatencySamples:
    """Vectorized over all tokens: one pass to flatten, then numpy."""
    n = len(requests)
    counts = np.fromiter((len(r.token_times_s) for r in requests), dtype=np.int64, count=n)
    arrival = np.fromiter((r.arrival_s for r in requests), dtype=np.float64, count=n)
    slo_ttft = np.fromiter((r.slo_ttft_s for r in requests), dtype=np.float64, count=n)
    slo_tbt = np.fromiter((r.slo_tbt_s for r in requests), dtype=np.float64, count=n)
    finished = np.fromiter((r.finish_s is not None for r in requests), dtype=np.bool_, count=n)
    total = int(counts.sum())
    times = np.fromiter(
        itertools.chain.from_iterable(r.token_times_s for r in requests),
        dtype=np.float64,
        count=total,
    )

    has_token = counts > 0
    start = np.cumsum(counts) - counts
    first = np.full(n, np.nan)
    last = np.full(n, np.nan)
    first[has_token] = times[start[has_token]]
    last[has_token] = times[start[has_token] + counts[has_token] - 1]

    ttft = first - arrival
    ttft_ok = np.zeros(n, dtype=np.bool_)
    ttft_ok[has_token] = ttft[has_token] <= slo_ttft[has_token] + SLO_TOLERANCE_S

    owner = np.repeat(np.arange(n), counts)
    same = owner[1:] == owner[:-1]
    gaps = np.diff(times)[same]
    gap_slo = slo_tbt[owner[:-1][same]]
    gap_ok = gaps <= gap_slo + SLO_TOLERANCE_S

    multi = finished & (counts >= 2)
    tpot = (last[multi] - first[multi]) / (counts[multi] - 1)
    tpot_ok = finished.copy()
    tpot_ok[multi] = tpot <= slo_tbt[multi] + SLO_TOLERANCE_S

    span = 0.0
    if n:
        ends = [r.finish_s for r in requests if r.finish_s is not None]
        if total:
            ends.append(float(times.max()))
        if ends:
            span = max(0.0, max(ends) - float(arrival.min()))

    return LatencySamples(
        ttft_s=ttft,
        ttft_attained=ttft_ok,
        slo_ttft_s=slo_ttft,
        tbt_s=gaps,
        tbt_attained=gap_ok,
        tbt_slo_s=gap_slo,
        tpot_s=tpot,
        tpot_attained=tpot_ok,
        finished=finished,
        tokens=counts,
        span_s=span,
    )


def _fraction(part: float, whole: float) -> float | None:
    return part / whole if whole else None


@dataclass(frozen=True, slots=True)
class PolicyMetrics:
    """One policy's run, summarized (see the module docstring for the
    definitions). Attainments are fractions in [0, 1]."""

    policy: str
    requests: int
    finished: int
    unfinished: int
    # SLO attainment.
    ttft_attained: int
    ttft_attainment: float | None
    tbt_samples: int
    tbt_attained: int
    tbt_attainment: float | None
    tpot_attained: int
    tpot_attainment: float | None
    both_attained: int
    both_attainment: float | None
    # Latency, seconds.
    ttft_s: Distribution
    tbt_s: Distribution
    tpot_s: Distribution
    # Throughput.
    output_tokens: int
    span_s: float
    throughput_tok_s: float | None
    throughput_req_s: float | None
    # Preemption, transfers, memory.
    preemptions: int
    swap_outs: int
    swap_ins: int
    recomputed_tokens: int
    bytes_d2h: int
    bytes_h2d: int
    bytes_moved: int
    stall_s: float
    stall_fraction: float | None
    peak_gpu_kv_blocks: int
    gpu_kv_blocks_total: int
    peak_gpu_kv_fraction: float | None
    # The run itself.
    iterations: int
    simulated_s: float
    wall_s: float
    sim_speed: float | None
    # Prefix caching: prompt tokens found cached at the requests' first
    # start, and their share of those requests' prompt tokens (None without
    # a prefix cache).
    prefix_hit_tokens: int = 0
    prefix_hit_rate: float | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @staticmethod
    def from_json(data: dict[str, Any]) -> PolicyMetrics:
        values: dict[str, Any] = {}
        for f in fields(PolicyMetrics):
            if f.name in _ADDED_LATER and f.name not in data:
                continue
            value = data[f.name]
            if f.name in _DISTRIBUTIONS:
                value = Distribution.from_json(value)
            values[f.name] = value
        return PolicyMetrics(**values)


_DISTRIBUTIONS = frozenset({"ttft_s", "tbt_s", "tpot_s"})
# Fields a summary written before them lacks (their defaults stand).
_ADDED_LATER = frozenset({"prefix_hit_tokens", "prefix_hit_rate"})

# Metrics per policy at each rate scale of a `--rate-scale` sweep.
Sweep = Mapping[float, Sequence[PolicyMetrics]]


class OfPolicy(Protocol):
    """A topology's metrics of one policy's run."""

    @property
    def policy(self) -> str: ...


P = TypeVar("P", bound=OfPolicy)


def sweep_policies(sweep: Mapping[float, Sequence[P]]) -> list[str]:
    """The policies of a sweep, in the order they first appear."""
    names: list[str] = []
    for scale in sorted(sweep):
        for m in sweep[scale]:
            if m.policy not in names:
                names.append(m.policy)
    return names


def summarize(result: ReplayResult) -> PolicyMetrics:
    """Metrics of one policy's run."""
    s = latency_samples(result.requests)
    t = result.totals
    n = len(result.requests)
    finished = int(s.finished.sum())
    ttft_ok = int(s.ttft_attained.sum())
    tbt_ok = int(s.tbt_attained.sum())
    tpot_ok = int(s.tpot_attained.sum())
    both_ok = int((s.ttft_attained & s.tpot_attained).sum())
    tokens = int(s.tokens.sum())
    return PolicyMetrics(
        policy=result.policy,
        requests=n,
        finished=finished,
        unfinished=n - finished,
        ttft_attained=ttft_ok,
        ttft_attainment=_fraction(ttft_ok, n),
        tbt_samples=int(s.tbt_s.size),
        tbt_attained=tbt_ok,
        tbt_attainment=_fraction(tbt_ok, s.tbt_s.size),
        tpot_attained=tpot_ok,
        tpot_attainment=_fraction(tpot_ok, n),
        both_attained=both_ok,
        both_attainment=_fraction(both_ok, n),
        ttft_s=Distribution.of(s.ttft_s[~np.isnan(s.ttft_s)]),
        tbt_s=Distribution.of(s.tbt_s),
        tpot_s=Distribution.of(s.tpot_s),
        output_tokens=tokens,
        span_s=s.span_s,
        throughput_tok_s=_fraction(tokens, s.span_s),
        throughput_req_s=_fraction(finished, s.span_s),
        preemptions=t.preemptions,
        swap_outs=t.swap_outs,
        swap_ins=t.swap_ins,
        recomputed_tokens=sum(r.recomputed_tokens for r in result.requests),
        bytes_d2h=t.bytes_d2h,
        bytes_h2d=t.bytes_h2d,
        bytes_moved=t.bytes_d2h + t.bytes_h2d,
        stall_s=t.stall_s,
        stall_fraction=_fraction(t.stall_s, t.simulated_s),
        peak_gpu_kv_blocks=t.peak_gpu_kv_blocks,
        gpu_kv_blocks_total=t.gpu_kv_blocks_total,
        peak_gpu_kv_fraction=_fraction(t.peak_gpu_kv_blocks, t.gpu_kv_blocks_total),
        iterations=t.iterations,
        simulated_s=t.simulated_s,
        wall_s=t.wall_s,
        sim_speed=_fraction(t.simulated_s, t.wall_s),
        prefix_hit_tokens=t.prefix_hit_tokens,
        prefix_hit_rate=_fraction(t.prefix_hit_tokens, t.prefix_queried_tokens),
    )


def compare(results: Iterable[ReplayResult]) -> list[PolicyMetrics]:
    """Metrics of each policy's run, in the order given."""
    return [summarize(r) for r in results]
