"""One row per request per run: what each request of a replay went through,
for analysis in pandas, a notebook or a spreadsheet (`--requests-out`).

Columns, times in simulated seconds (definitions as in planner.replay.metrics;
NaN where a value does not exist, such as the TTFT of a request that never
produced a token):

- ``policy``, ``rate_scale``: the run the row belongs to.
- ``id``, ``arrival_s``, ``prompt_tokens``, ``output_tokens`` (asked for),
  ``tokens`` (produced), ``first_token_s``, ``finish_s``.
- ``ttft_s``, ``tpot_s`` (finished requests with two or more tokens),
  ``max_tbt_s`` (the longest gap between two of its tokens).
- ``slo_ttft_s``, ``slo_tbt_s``, ``ttft_met``, ``tpot_met``, ``both_met``.
- ``preemptions``, ``swap_outs``, ``swap_ins``, ``recomputed_tokens``.
- ``cached_tokens``: prompt tokens the prefix cache held when the request
  first started (0 without a prefix cache).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from planner.replay.metrics import latency_samples
from planner.replay.records import ReplayResult

COLUMNS = (
    "policy",
    "rate_scale",
    "id",
    "arrival_s",
    "prompt_tokens",
    "output_tokens",
    "tokens",
    "first_token_s",
    "finish_s",
    "ttft_s",
    "tpot_s",
    "max_tbt_s",
    "slo_ttft_s",
    "slo_tbt_s",
    "ttft_met",
    "tpot_met",
    "both_met",
    "preemptions",
    "swap_outs",
    "swap_ins",
    "recomputed_tokens",
    "cached_tokens",
)


def run_requests(result: ReplayResult) -> pd.DataFrame:
    """The rows of one run, in the order of ``result.requests``."""
    requests = result.requests
    samples = latency_samples(requests)
    n = len(requests)
    tokens = samples.tokens
    has_token = tokens > 0
    first_token = np.full(n, np.nan)
    first_token[has_token] = [r.token_times_s[0] for r in requests if r.token_times_s]
    tpot = np.full(n, np.nan)
    tpot[samples.finished & (tokens >= 2)] = samples.tpot_s
    max_tbt = np.full(n, np.nan)
    for i, r in enumerate(requests):
        if len(r.token_times_s) >= 2:
            max_tbt[i] = float(np.diff(r.token_times_s).max())
    finish = np.array(
        [np.nan if r.finish_s is None else r.finish_s for r in requests], dtype=np.float64
    )
    frame = pd.DataFrame(
        {
            "policy": result.policy,
            "rate_scale": _rate_scale(result),
            "id": [r.id for r in requests],
            "arrival_s": [r.arrival_s for r in requests],
            "prompt_tokens": np.array([r.prompt_tokens for r in requests], dtype=np.int64),
            "output_tokens": np.array([r.output_tokens for r in requests], dtype=np.int64),
            "tokens": tokens,
            "first_token_s": first_token,
            "finish_s": finish,
            "ttft_s": samples.ttft_s,
            "tpot_s": tpot,
            "max_tbt_s": max_tbt,
            "slo_ttft_s": samples.slo_ttft_s,
            "slo_tbt_s": np.array([r.slo_tbt_s for r in requests], dtype=np.float64),
            "ttft_met": samples.ttft_attained,
            "tpot_met": samples.tpot_attained,
            "both_met": samples.ttft_attained & samples.tpot_attained,
            "preemptions": np.array([r.preemptions for r in requests], dtype=np.int64),
            "swap_outs": np.array([r.swap_outs for r in requests], dtype=np.int64),
            "swap_ins": np.array([r.swap_ins for r in requests], dtype=np.int64),
            "recomputed_tokens": np.array([r.recomputed_tokens for r in requests], dtype=np.int64),
            "cached_tokens": np.array([r.cached_tokens for r in requests], dtype=np.int64),
        },
        columns=list(COLUMNS),
    )
    return frame


def _rate_scale(result: ReplayResult) -> float:
    scale = result.config.get("rate_scale", 1.0)
    return float(scale) if isinstance(scale, int | float) else 1.0


def request_table(results: Sequence[ReplayResult]) -> pd.DataFrame:
    """The rows of every run, run after run."""
    frames = [run_requests(r) for r in results]
    if not frames:
        return pd.DataFrame(columns=list(COLUMNS))
    return pd.concat(frames, ignore_index=True)
