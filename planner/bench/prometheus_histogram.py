"""A Prometheus histogram read off a server's /metrics text: its cumulative
bucket counts, the difference of two readings, and a quantile interpolated
within its bucket as Prometheus' histogram_quantile does."""

from __future__ import annotations

import math
import urllib.error
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

# Cumulative counts by bucket bound ("le", as the text writes it).
Buckets = dict[str, float]


def histogram_buckets(text: str, metric: str) -> Buckets:
    """metric's cumulative bucket counts in a /metrics text, summed over its
    label sets (empty when it is not there)."""
    out: Buckets = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == f"{metric}_bucket":
                le = sample.labels["le"]
                out[le] = out.get(le, 0.0) + sample.value
    return out


def read_histogram(url: str, metric: str, timeout_s: float = 10.0) -> Buckets:
    """metric's buckets as the server at url serves them now (empty when its
    /metrics cannot be read)."""
    try:
        with urllib.request.urlopen(f"{url}/metrics", timeout=timeout_s) as response:
            text = response.read().decode()
    except (OSError, urllib.error.URLError, ValueError):
        return {}
    return histogram_buckets(text, metric)


def buckets_between(after: Buckets, before: Buckets) -> Buckets:
    """What was observed between two readings (empty when either is)."""
    if not after or not before:
        return {}
    return {le: count - before.get(le, 0.0) for le, count in after.items()}


def bucket_quantile(buckets: Buckets, q: float) -> float | None:
    """The q-quantile of cumulative bucket counts, interpolated linearly
    within its bucket (the +Inf bucket gives its lower bound); None when
    empty."""
    ordered = sorted((float(le), count) for le, count in buckets.items())
    if not ordered or ordered[-1][1] <= 0:
        return None
    rank = q * ordered[-1][1]
    lower, below = 0.0, 0.0
    for bound, count in ordered:
        if count >= rank:
            if math.isinf(bound):
                return lower
            inside = count - below
            return lower + (bound - lower) * ((rank - below) / inside if inside else 1.0)
        lower, below = bound, count
    return None


def bucket_count(buckets: Buckets) -> float:
    """How many observations the buckets hold."""
    return max(buckets.values(), default=0.0)
