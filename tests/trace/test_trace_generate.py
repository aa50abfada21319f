"""The synthetic generator: rates, burstiness, schedules, lengths, seeds."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from planner.trace.arrivals import RateSchedule, arrival_times
from planner.trace.errors import SpecError, TraceError
from planner.trace.generate import GenConfig, generate
from planner.trace.length_model import LengthModel, build_length_model
from planner.trace.lengths import LogNormal, Quantiles, parse_dist
from planner.trace.lengths_file import read_lengths_file
from planner.trace.presets import PRESETS
from planner.trace.stats import compute_stats


def lengths(
    spec: str | None = "sharegpt",
    *,
    prompt: str | None = None,
    output: str | None = None,
    max_prompt: int | None = None,
    max_output: int | None = None,
) -> LengthModel:
    return build_length_model(
        lengths=spec,
        prompt_lengths=prompt,
        output_lengths=output,
        max_prompt_tokens=max_prompt,
        max_output_tokens=max_output,
    )


def config(**kwargs: object) -> GenConfig:
    base: dict[str, object] = {
        "schedule": RateSchedule.constant(10.0),
        "lengths": lengths(),
        "seed": 0,
        "duration_s": 100.0,
    }
    base.update(kwargs)
    return GenConfig(**base)  # type: ignore[arg-type]


def gaps_cv(times: np.typing.NDArray[np.float64]) -> float:
    gaps = np.diff(times)
    return float(gaps.std() / gaps.mean())


def test_deterministic_for_a_seed() -> None:
    a = generate(config(seed=42))
    assert a == generate(config(seed=42))
    assert a != generate(config(seed=43))


def test_lengths_do_not_depend_on_the_arrival_settings() -> None:
    slow = generate(config(schedule=RateSchedule.constant(5.0), num_requests=50, duration_s=None))
    fast = generate(config(schedule=RateSchedule.constant(50.0), num_requests=50, duration_s=None))
    assert [r.prompt_tokens for r in slow] == [r.prompt_tokens for r in fast]
    assert [r.arrival_s for r in slow] != [r.arrival_s for r in fast]


def test_poisson_rate_and_cv() -> None:
    rng = np.random.default_rng(1)
    times = arrival_times(RateSchedule.constant(20.0), 1.0, rng, duration_s=1000.0)
    # 20,000 expected; a Poisson count's std is ~141, so 2 % is > 2.8 sigma.
    assert len(times) == pytest.approx(20_000, rel=0.02)
    assert gaps_cv(times) == pytest.approx(1.0, abs=0.03)
    assert times[0] > 0 and times[-1] < 1000.0 and np.all(np.diff(times) >= 0)


@pytest.mark.parametrize("cv", [0.5, 2.0, 4.0])
def test_gamma_gaps_have_the_requested_cv_and_rate(cv: float) -> None:
    rng = np.random.default_rng(2)
    times = arrival_times(RateSchedule.constant(10.0), cv, rng, num_requests=40_000)
    assert gaps_cv(times) == pytest.approx(cv, rel=0.06)
    assert 1 / np.diff(times).mean() == pytest.approx(10.0, rel=0.06)


def test_cv_zero_is_evenly_spaced() -> None:
    times = arrival_times(RateSchedule.constant(4.0), 0.0, np.random.default_rng(0), num_requests=5)
    assert times.tolist() == [0.25, 0.5, 0.75, 1.0, 1.25]


def test_rate_schedule_is_respected() -> None:
    schedule = RateSchedule.parse("0:5,60:20,90:5")
    rng = np.random.default_rng(3)
    runs = [arrival_times(schedule, 1.0, rng, duration_s=150.0) for _ in range(40)]
    times = np.concatenate(runs)
    for lo, hi, rate in [(0, 60, 5), (60, 90, 20), (90, 150, 5)]:
        count = np.count_nonzero((times >= lo) & (times < hi))
        expected = rate * (hi - lo) * len(runs)
        assert count == pytest.approx(expected, rel=0.05), (lo, hi)


def test_schedule_with_a_silent_gap() -> None:
    schedule = RateSchedule.parse("0:10,10:0,20:10")
    times = arrival_times(schedule, 1.0, np.random.default_rng(4), duration_s=30.0)
    assert not np.any((times >= 10) & (times < 20))
    assert np.any(times < 10) and np.any(times >= 20)
    assert schedule.cumulative(25.0) == 150.0


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("5:1", "start at 0"),
        ("0:5,60", "START_S:RATE_RPS"),
        ("0:5,0:6", "increase"),
        ("0:-1", ">= 0"),
        ("0:0", "rate > 0"),
        ("0:x", "START_S:RATE_RPS"),
        ("0:nan", ">= 0"),
    ],
)
def test_bad_rate_schedules(text: str, reason: str) -> None:
    with pytest.raises(SpecError, match=reason):
        RateSchedule.parse(text)


def test_size_options() -> None:
    assert len(generate(config(num_requests=17, duration_s=None))) == 17
    both = generate(config(num_requests=5, duration_s=1000.0))
    assert len(both) == 5
    short = generate(config(num_requests=10_000, duration_s=1.0))
    assert len(short) < 40 and short[-1].arrival_s < 1.0
    with pytest.raises(SpecError, match="--duration or --num-requests"):
        generate(config(duration_s=None))
    with pytest.raises(SpecError, match="needs --duration"):
        generate(config(schedule=RateSchedule.parse("0:5,10:0"), num_requests=5, duration_s=None))
    with pytest.raises(SpecError, match="--seed"):
        generate(config(seed=-1))
    with pytest.raises(SpecError, match="--burstiness"):
        generate(config(burstiness=-0.5))


def test_sharegpt_preset_matches_its_fitted_statistics() -> None:
    trace = generate(
        config(schedule=RateSchedule.constant(100.0), num_requests=40_000, duration_s=None)
    )
    stats = compute_stats(trace)
    # The fit of presets.py: prompt p50 1730, p90 5696, p99 7434, mean 2340;
    # output p50 415, p90 834, p99 998, mean 438.7 (sampling noise ~1-2 %).
    assert stats.prompt.p50 == pytest.approx(1730, rel=0.04)
    assert stats.prompt.p90 == pytest.approx(5696, rel=0.03)
    assert stats.prompt.p99 == pytest.approx(7434, rel=0.02)
    assert stats.prompt.mean == pytest.approx(2340, rel=0.03)
    assert stats.output.p50 == pytest.approx(415, rel=0.03)
    assert stats.output.p90 == pytest.approx(834, rel=0.03)
    assert stats.output.mean == pytest.approx(438.7, rel=0.03)
    assert stats.prompt.min >= 1 and stats.output.max <= 1024


def test_presets_are_well_formed() -> None:
    assert set(PRESETS) == {"sharegpt", "azure-conv", "azure-code"}
    for preset in PRESETS.values():
        assert preset.prompt.percentiles[0] == 0 and preset.prompt.percentiles[-1] == 100


def test_clamps_and_per_side_overrides() -> None:
    model = lengths(prompt="fixed:300", max_prompt=200, max_output=50)
    trace = generate(config(lengths=model))
    assert {r.prompt_tokens for r in trace} == {200}
    assert max(r.output_tokens for r in trace) == 50  # sharegpt outputs, clamped
    both = generate(config(lengths=lengths("uniform:low=3,high=5")))
    assert {r.prompt_tokens for r in both} == {3, 4, 5} == {r.output_tokens for r in both}


def test_distribution_specs() -> None:
    rng = np.random.default_rng(0)
    ln = parse_dist("lognormal:median=200,sigma=0.8")
    assert ln == LogNormal(200.0, 0.8)
    assert float(np.median(ln.sample(rng, 20_000))) == pytest.approx(200, rel=0.04)
    capped = parse_dist("lognormal:median=200,sigma=1.5,max=400").sample(rng, 5000)
    assert capped.max() <= 400 and capped.min() >= 1
    q = parse_dist("quantiles:0=10,50=100,100=1000")
    assert q == Quantiles((0.0, 50.0, 100.0), (10, 100, 1000))
    draws = q.sample(rng, 20_000)
    assert draws.min() >= 10 and draws.max() <= 1000
    assert float(np.median(draws)) == pytest.approx(100, rel=0.05)
    assert parse_dist("fixed:7").sample(rng, 3).tolist() == [7, 7, 7]
    assert parse_dist("fixed:value=7").spec() == "fixed:7"


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("gauss:mu=1", "unknown distribution"),
        ("lognormal:median=200", "missing parameter 'sigma'"),
        ("lognormal:median=200,sigma=1,mu=3", "unknown parameter 'mu'"),
        ("lognormal:median=-1,sigma=1", "median must be"),
        ("lognormal:median=500,sigma=1,max=100", "<= max"),
        ("fixed:0", ">= 1"),
        ("fixed:2.5", "integer"),
        ("uniform:low=5,high=2", "high"),
        ("quantiles:0=1,90=10", "0 and 100"),
        ("quantiles:0=10,50=5,100=20", "not decrease"),
        ("lognormal:median", "KEY=VALUE"),
    ],
)
def test_bad_distribution_specs(text: str, reason: str) -> None:
    with pytest.raises(SpecError, match=reason):
        parse_dist(text)


def test_unknown_preset_and_conflicts() -> None:
    with pytest.raises(SpecError, match="unknown preset 'alpaca'"):
        lengths("alpaca")


def test_lengths_file_resampling_keeps_pairs(tmp_path: Path) -> None:
    path = tmp_path / "lengths.csv"
    path.write_text("num_prefill_tokens,num_decode_tokens,x\n10,1,a\n20,2,b\n30,0,c\n")
    loaded = read_lengths_file(path)
    assert (loaded.rows, loaded.skipped_zero) == (3, 1)
    trace = generate(config(lengths=loaded.lengths, num_requests=200, duration_s=None))
    assert {(r.prompt_tokens, r.output_tokens) for r in trace} == {(10, 1), (20, 2)}
    jsonl = tmp_path / "lengths.jsonl"
    jsonl.write_text('{"input_length": 5, "output_length": 6}\n')
    assert read_lengths_file(jsonl).lengths.prompt_tokens.tolist() == [5]


def test_bad_lengths_files(tmp_path: Path) -> None:
    bad = tmp_path / "a.csv"
    bad.write_text("prompt_tokens,output_tokens\n10,1\n1.5,2\n")
    with pytest.raises(TraceError, match=r"a\.csv:3: prompt_tokens: must be an integer"):
        read_lengths_file(bad)
    wrong = tmp_path / "b.csv"
    wrong.write_text("p,o\n1,2\n")
    with pytest.raises(TraceError, match="no length columns"):
        read_lengths_file(wrong)
    with pytest.raises(TraceError, match=r"\.csv or \.jsonl"):
        read_lengths_file(tmp_path / "c.parquet")
