"""The serverless replay's timeline (planner.replay.serverless_timeline):
recording it changes no result; on every policy each slice's KV in use
stays within its KV room and the room plus the resident weights within the
slice's HBM; the link's load adds up to the C2C bytes of the table; a
hand-checked switch; the sample count stays bounded on evenly spaced
times; and the plots it feeds (the CLI round trip is in
test_serverless_cli.py)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from planner.domain.requests import Slo
from planner.profiles.mig import GB
from planner.replay import plots, serverless_timeline
from planner.replay.records import TimelineSample, UnitSample
from planner.replay.serverless_engine import (
    C2CSERVE,
    DEDICATED,
    SERVERLESS_POLICY_NAMES,
    ServerlessConfig,
    ServerlessEngine,
    ServerlessRun,
)
from planner.replay.serverless_plots import write_serverless_report
from planner.replay.serverless_report import compare_serverless
from planner.replay.serverless_setup import ServerlessKnobs, serverless_config
from planner.replay.setup import ReplayKnobs, build_setup
from planner.trace.records import TraceRequest

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
# Llama-3-8B: its weights, and KV bytes per token (2 x 32 layers x 8 KV
# heads x 128 x 2 bytes).
WEIGHT_BYTES = 16_060_522_496
KV_TOKEN_BYTES = 131_072


def config(mig: str = "3") -> ServerlessConfig:
    setup = build_setup(
        "llama-3-8b@h100-sxm-80gb",
        ReplayKnobs(slo=Slo(ttft_s=5.0, tbt_s=0.25), max_batched_tokens=512, max_running=16),
    )
    return serverless_config(setup, replace(ServerlessKnobs(), mig=mig))


def bursty(requests: int = 60, models: int = 5) -> list[TraceRequest]:
    """Arrivals in bursts, most for a few popular models: switches, shares,
    preemptions and KV swaps on three slices."""
    rng = np.random.default_rng(11)
    arrival = np.cumsum(rng.exponential(0.15, requests))
    popular = rng.zipf(1.6, requests) % models
    return [
        TraceRequest(
            arrival_s=float(arrival[i]),
            prompt_tokens=int(rng.integers(64, 2048)),
            output_tokens=int(rng.integers(8, 256)),
            id=f"r{i}",
            model=f"m{int(popular[i])}",
        )
        for i in range(requests)
    ]


def recorded(cfg: ServerlessConfig, policy: str, trace: list[TraceRequest]) -> ServerlessRun:
    return ServerlessEngine(cfg, policy, trace, records_timeline=True).run()


def times(timeline: list[TimelineSample]) -> np.ndarray:
    return np.array([s.time_s for s in timeline])


@pytest.mark.parametrize("policy", SERVERLESS_POLICY_NAMES)
def test_recording_changes_nothing_and_kv_stays_in_its_room(policy: str) -> None:
    cfg = config()
    trace = bursty()
    plain = ServerlessEngine(cfg, policy, trace).run()
    run = recorded(cfg, policy, trace)
    assert plain.result.timeline == []
    assert run.result.requests == plain.result.requests
    assert run.stats == plain.stats
    assert run.switches == plain.switches
    timeline = run.result.timeline
    assert 0 < len(timeline) < 2 * serverless_timeline.MAX_SAMPLES
    hbm = cfg.slices[0].hbm_bytes * 0.9 - 1.5e9
    for sample in timeline:
        assert [u.name for u in sample.units] == ["mig0", "mig1", "mig2"]
        for u in sample.units:
            assert 0 <= u.kv_used <= u.kv_capacity
            assert u.kv_capacity * KV_TOKEN_BYTES + u.weight_bytes <= hbm
            assert u.running >= 0 and u.waiting >= 0
        assert sample.gpu_kv_blocks_used == sum(u.kv_used for u in sample.units)
        assert sample.gpu_kv_blocks_capacity == sum(u.kv_capacity for u in sample.units)
        assert sample.running == sum(u.running for u in sample.units)
        assert 0 <= sample.rotary <= sample.waiting + sum(u.waiting for u in sample.units)
    # Sampled after the last event: everything finished.
    last = timeline[-1]
    assert (last.running, last.waiting, last.gpu_kv_blocks_used, last.rotary) == (0, 0, 0, 0)
    # The link's load over each interval adds up to the C2C bytes moved.
    t = times(timeline)
    gbps = np.array([s.link_gbps for s in timeline])
    assert float((gbps[1:] * np.diff(t)).sum()) * GB == pytest.approx(run.stats.c2c_bytes, 1e-9)


def test_the_trace_exercises_switches_shares_and_kv_in_host_memory() -> None:
    run = recorded(config(), C2CSERVE, bursty())
    assert run.stats.switches > 3
    assert run.stats.shares > 0
    assert max(s.rotary for s in run.result.timeline) > 0
    assert max(s.cpu_kv_blocks_used for s in run.result.timeline) > 0
    rooms = {u.kv_capacity for s in run.result.timeline for u in s.units}
    assert len(rooms) > 2  # the KV room moves with the resident weights


def test_switch_hand_checked() -> None:
    """One 96 GB slice: a's request at 0, b's at 0.5 (a's is done by then):
    c2cserve sets a up, then switches the slice to b, each time copying
    b's weights whole over C2C (405 GB/s) while nothing streams."""
    cfg = config(mig="1")
    trace = [
        TraceRequest(arrival_s=0.0, prompt_tokens=300, output_tokens=40, id="a", model="a"),
        TraceRequest(arrival_s=0.5, prompt_tokens=300, output_tokens=40, id="b", model="b"),
    ]
    run = recorded(cfg, C2CSERVE, trace)
    assert [(w.from_model, w.to_model) for w in run.switches] == [("", "a"), ("a", "b")]
    # HBM 96 GB x 0.9 less 1.5 GB of runtime: 84.9 GB; less the weights,
    # KV room for 68.84 GB / 131,072 B = 525,203 tokens.
    room = 525_203
    assert int((96e9 * 0.9 - 1.5e9 - WEIGHT_BYTES) // KV_TOKEN_BYTES) == room
    timeline = run.result.timeline
    first = timeline[0]
    assert first.time_s == 0.0
    assert first.units == (UnitSample("mig0", 0, room, WEIGHT_BYTES, 0, 1),)
    for sample in timeline:
        (u,) = sample.units
        assert (u.weight_bytes, u.kv_capacity) == (WEIGHT_BYTES, room)
        assert u.kv_used <= 340  # a prompt of 300 and 40 tokens, one request at a time
    assert max(u.kv_used for s in timeline for u in s.units) > 300
    # Each copy moves the weights at the link's 405 GB/s: 39.7 ms.
    t = times(timeline)
    gbps = np.array([s.link_gbps for s in timeline])
    moved = gbps[1:] * np.diff(t) * GB
    switch_b = (t[1:] > 0.5) & (t[1:] <= 0.5 + WEIGHT_BYTES / (405 * GB) + 0.02)
    assert float(moved[switch_b].sum()) == pytest.approx(WEIGHT_BYTES, 1e-9)
    assert float(gbps.max()) <= 405.0 * (1 + 1e-9)
    assert run.stats.c2c_bytes == pytest.approx(2 * WEIGHT_BYTES, 1e-12)


def test_samples_stay_bounded_and_evenly_spaced(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(serverless_timeline, "MAX_SAMPLES", 8)
    trace = bursty()
    run = recorded(config(), DEDICATED, trace)
    t = times(run.result.timeline)
    assert 8 <= t.size < 16
    gaps = np.diff(t)
    assert np.allclose(gaps, gaps[0], rtol=1e-9)
    first_interval = (trace[-1].arrival_s - trace[0].arrival_s) / 8
    doublings = np.log2(gaps[0] / first_interval)
    assert doublings >= 1 and doublings == pytest.approx(round(doublings), abs=1e-9)
    assert t[0] == trace[0].arrival_s
    assert t[-1] >= max(o.finish_s or 0.0 for o in run.result.requests)


def test_report_draws_the_timeline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(plots, "DPI", 40)
    monkeypatch.setattr(plots, "MAX_POINTS", 100)  # exercise binning
    cfg = config()
    runs = [recorded(cfg, p, bursty()) for p in (C2CSERVE, DEDICATED)]
    paths = write_serverless_report(tmp_path, runs, compare_serverless(runs))
    assert [p.name for p in paths] == [
        "ttft_cdf.png",
        "tbt_cdf.png",
        "kv_occupancy.png",
        "queue_length.png",
        "slices.png",
        "link_load.png",
    ]
    for p in paths:
        data = p.read_bytes()
        assert data.startswith(PNG_SIGNATURE) and len(data) > 1000
    # Runs without a timeline (an engine not asked to record): the CDFs only.
    bare = [ServerlessEngine(cfg, C2CSERVE, bursty()).run()]
    names = [
        p.name for p in write_serverless_report(tmp_path / "bare", bare, compare_serverless(bare))
    ]
    assert names == ["ttft_cdf.png", "tbt_cdf.png"]


def test_time_weighted_mean_is_the_link_utilization() -> None:
    run = recorded(config(), C2CSERVE, bursty())
    mean = plots.time_weighted_mean(run.result, "link_gbps")
    t = times(run.result.timeline)
    assert mean is not None
    assert mean * (t[-1] - t[0]) * GB == pytest.approx(run.stats.c2c_bytes, 1e-9)
