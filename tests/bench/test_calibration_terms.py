"""The terms a calibrated replay adds to a measured profile: the spread of the
engine's step times (read off its inter-token histogram around decode
probes), the rotation plugin's planner call per step (its counters), the
front end's tokenization; and how `planner replay` picks them up."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import pytest

from planner.bench.calibration import Measurement, ServedRun, Settings, planning_s_per_call
from planner.bench.calibration_loads import LOADS
from planner.bench.engine_profile import (
    JITTER_MIN_GAPS,
    Z_99,
    Probe,
    ProbeRun,
    build_profile,
    model_from_config,
    step_spread,
)
from planner.bench.openai_stream import StreamRecord
from planner.bench.prometheus_histogram import (
    bucket_count,
    bucket_quantile,
    buckets_between,
    histogram_buckets,
)
from planner.profiles.loading import load_profile, save_profile
from planner.replay.setup import ReplayKnobs, build_setup
from tests.bench.test_engine_profile_work import CONFIG, _result

METRICS_TEXT = """\
# HELP vllm:inter_token_latency_seconds Histogram of inter-token latency in seconds.
# TYPE vllm:inter_token_latency_seconds histogram
vllm:inter_token_latency_seconds_bucket{engine="0",le="0.001",model_name="m"} 0.0
vllm:inter_token_latency_seconds_bucket{engine="0",le="0.002",model_name="m"} 50.0
vllm:inter_token_latency_seconds_bucket{engine="0",le="0.004",model_name="m"} 99.0
vllm:inter_token_latency_seconds_bucket{engine="0",le="+Inf",model_name="m"} 100.0
vllm:inter_token_latency_seconds_count{engine="0",model_name="m"} 100.0
vllm:inter_token_latency_seconds_sum{engine="0",model_name="m"} 0.25
"""
METRIC = "vllm:inter_token_latency_seconds"


def test_a_histogram_read_off_the_metrics_text() -> None:
    buckets = histogram_buckets(METRICS_TEXT, METRIC)
    assert buckets == {"0.001": 0.0, "0.002": 50.0, "0.004": 99.0, "+Inf": 100.0}
    assert bucket_count(buckets) == 100.0
    assert bucket_quantile(buckets, 0.5) == pytest.approx(0.002)
    assert bucket_quantile(buckets, 0.99) == pytest.approx(0.004)
    # The +Inf bucket gives its lower bound.
    assert bucket_quantile(buckets, 1.0) == pytest.approx(0.004)
    assert histogram_buckets(METRICS_TEXT, "vllm:other") == {}
    assert bucket_quantile({}, 0.5) is None
    earlier = {"0.001": 0.0, "0.002": 10.0, "0.004": 10.0, "+Inf": 10.0}
    assert buckets_between(buckets, earlier) == {
        "0.001": 0.0,
        "0.002": 40.0,
        "0.004": 89.0,
        "+Inf": 90.0,
    }
    assert buckets_between(buckets, {}) == {}


def _run(probe: Probe, gaps: dict[str, float], prompt_tokens: int = 20) -> ProbeRun:
    records = [
        StreamRecord(
            id=f"{probe.name}-{i}",
            send_at_s=0.0,
            max_tokens=probe.output_tokens,
            sent_s=0.0,
            prompt_tokens=prompt_tokens,
            completion_tokens=probe.output_tokens,
            token_times_s=[0.01 * (k + 1) for k in range(probe.output_tokens)],
            finish_reason="length",
        )
        for i in range(probe.batch)
    ]
    return ProbeRun(probe, 0, records, None, gaps)


def _gaps(p50: float, p99: float) -> dict[str, float]:
    """Cumulative buckets of 100 gaps whose p50 and p99 interpolate to p50
    and p99."""
    return {f"{p50 / 2:g}": 0.0, f"{p50:g}": 50.0, f"{p99:g}": 99.0, "+Inf": 100.0}


def test_the_step_spread_comes_from_decode_probes_that_decode_one_batch() -> None:
    runs = [
        _run(Probe(1, 16, 96), _gaps(0.002, 0.004)),
        _run(Probe(8, 16, 96), _gaps(0.003, 0.009)),
        _run(Probe(32, 16, 96), _gaps(0.004, 0.010)),
        # Left out: a prefill probe, one whose prompts prefill over several
        # steps (8 x 300 > 2048 tokens), one with too few gaps, one without
        # a histogram.
        _run(Probe(4, 300, 1), _gaps(0.002, 0.2)),
        _run(Probe(8, 300, 96), _gaps(0.002, 0.2), prompt_tokens=300),
        _run(Probe(1, 16, 96), {"0.002": JITTER_MIN_GAPS - 1.0, "+Inf": JITTER_MIN_GAPS - 1.0}),
        _run(Probe(1, 16, 96), {}),
    ]
    spread = step_spread(runs, max_batched_tokens=2048)
    assert spread is not None
    assert spread.ratios == pytest.approx([2.0, 3.0, 2.5])
    assert spread.ratio == pytest.approx(2.5)
    # The lognormal whose p99 / p50 is 2.5.
    sigma = math.log(2.5) / Z_99
    assert spread.cv == pytest.approx(math.sqrt(math.exp(sigma**2) - 1))
    assert step_spread(runs[3:], max_batched_tokens=2048) is None


def test_the_measured_spread_goes_in_the_profile(tmp_path: Path) -> None:
    model = model_from_config(CONFIG, "tiny")
    result = replace(_result(), runs=[_run(Probe(1, 16, 96), _gaps(0.002, 0.004))])
    path = tmp_path / "p.json"
    save_profile(build_profile(result, model, "tiny-engine"), path)
    profile = load_profile(path)
    sigma = math.log(2.0) / Z_99
    assert profile.extra_term("step_jitter_cv", "tiny") == pytest.approx(
        math.sqrt(math.exp(sigma**2) - 1)
    )
    assert "p99 / p50 2.00" in profile.cost_notes[("tiny", 1)]
    # Without a histogram: no term.
    save_profile(build_profile(_result(), model, "tiny-engine"), path)
    assert load_profile(path).extra_terms == {}


def test_the_replay_takes_the_planning_and_tokenization_terms(tmp_path: Path) -> None:
    model = model_from_config(CONFIG, "tiny")
    profile = build_profile(_result(), model, "tiny-engine")
    profile.extra_terms[("tiny", 1)] = {
        "planning_s_per_call": 0.0008,
        "tokenize_s_per_prompt_token": 3e-6,
    }
    path = tmp_path / "p.json"
    save_profile(profile, path)
    knobs = ReplayKnobs(block_size_tokens=32, gpu_kv_blocks=128, cpu_kv_blocks=64)
    engine = build_setup(f"tiny@{path}", knobs).engine
    assert engine.planning_s_per_call == 0.0008
    assert engine.tokenize_s_per_prompt_token == 3e-6
    # Without the front end, no tokenization; the planner's call stays.
    engine = build_setup(f"tiny@{path}", replace(knobs, admission_queue=False)).engine
    assert (engine.planning_s_per_call, engine.tokenize_s_per_prompt_token) == (0.0008, 0.0)


def test_the_planner_calls_cost_is_the_plugins_mean_call() -> None:
    def run(side: str, repeat: int, calls: float, seconds: float) -> ServedRun:
        return ServedRun(
            load=LOADS["rotation"],
            side=side,
            repeat=repeat,
            records=[],
            counters={"planner_calls": calls, "planner_call_s": seconds},
            wall_s=1.0,
            load_average_before=None,
            load_average_after=None,
        )

    runs = [
        run("rotation", 0, 1000, 0.8),
        run("rotation", 0, 0, 0.0),
        run("rotation", 0, 200, 0.22),
        run("vllm", 0, 50, 5.0),
        run("rotation", 1, 0, 0.0),
    ]
    m = Measurement(Settings(), runs, [], {}, "", Path("."))
    assert planning_s_per_call(m, 0) == pytest.approx(1.02 / 1200)
    assert planning_s_per_call(m, 1) is None
