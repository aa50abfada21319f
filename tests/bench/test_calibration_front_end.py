"""The calibrated replay's front end request by request (where vLLM's own
TTFT clock starts), and the in-process replay the calibration runs: the
same numbers as `planner replay`."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from planner.bench.calibration import Replayed, Settings, fit_error, replay_run
from planner.bench.calibration_front_end import (
    calibration_knobs,
    engine_reached_s,
    engine_ttft_quantiles,
    replay_in_process,
    time_to_engine_first_token_s,
)
from planner.replay.engine import admission_exits_s, front_end_passage_s
from planner.replay.report import metrics_from_json
from planner.trace.io import write_trace
from planner.trace.records import TraceRequest

PROFILE_PATH = Path(__file__).parent / "data" / "tiny-llama-engine.json"
PROFILE = f"tiny-llama-seed0@{PROFILE_PATH}"
SETTINGS = Settings()
KNOBS = calibration_knobs(
    slo_ttft_s=SETTINGS.slo_ttft_s,
    slo_tbt_s=SETTINGS.slo_tbt_s,
    block_size=SETTINGS.block_size,
    gpu_kv_blocks=SETTINGS.gpu_kv_blocks,
    cpu_kv_blocks=SETTINGS.cpu_kv_blocks,
    max_batched_tokens=SETTINGS.max_batched_tokens,
    max_running=SETTINGS.max_running,
)


def _burst(n: int = 40) -> list[TraceRequest]:
    return [
        TraceRequest(
            arrival_s=0.01 * i, prompt_tokens=60 + 7 * i, output_tokens=30 + 3 * i, id=f"r{i}"
        )
        for i in range(n)
    ]


@pytest.mark.parametrize("policy", ["fcfs-vllm", "lvf-vllm"])
def test_the_in_process_replay_is_planner_replays(tmp_path, policy):
    trace = _burst()
    trace_path, out = tmp_path / "t.jsonl", tmp_path / "o.json"
    write_trace(trace_path, trace)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "planner.cli",
            "replay",
            str(trace_path),
            "--profile",
            PROFILE,
            "--policy",
            policy,
            "--block-size",
            "32",
            "--gpu-kv-blocks",
            "128",
            "--cpu-kv-blocks",
            "4096",
            "--max-batched-tokens",
            "2048",
            "--max-running",
            "128",
            "--json-out",
            str(out),
            "--quiet",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    cli = metrics_from_json(json.loads(out.read_text(encoding="utf-8")))[0]
    replayed = replay_run(trace, PROFILE, policy, SETTINGS)
    assert replayed.metrics["ttft_p99_s"] == cli.ttft_s.p99
    assert replayed.metrics["tbt_p99_s"] == cli.tbt_s.p99
    assert replayed.metrics["preemptions"] == cli.preemptions
    assert replayed.metrics["throughput_tok_s"] == cli.throughput_tok_s


def test_requests_reach_the_engine_through_the_front_end():
    result, config = replay_in_process(_burst(), PROFILE, "fcfs-vllm", KNOBS)
    assert config.stream_s_per_step > 0 and config.admission_s_per_request > 0
    reached = engine_reached_s(result, config)
    entries = [r.arrival_s + config.request_latency_s for r in result.requests]
    tokens = [t for r in result.requests for t in r.token_times_s]
    _, exits = front_end_passage_s(
        entries,
        config.admission_s_per_request,
        tokens,
        config.stream_s_per_token,
        config.stream_s_per_step,
    )
    assert reached == exits
    # Never before its admission's own service, never before a first token
    # the engine made from it.
    for r, at, entry in zip(result.requests, reached, entries, strict=True):
        assert at >= entry + config.admission_s_per_request - 1e-12
        assert r.token_times_s[0] > at
    # The burst queues: the later requests wait behind the earlier ones'
    # admissions and tokens, more than the admissions alone would make them.
    alone = admission_exits_s(entries, config.admission_s_per_request)
    assert max(reached) > max(alone)


def test_vllms_clock_leaves_the_wait_before_it_out():
    result, config = replay_in_process(_burst(), PROFILE, "fcfs-vllm", KNOBS)
    to_first = time_to_engine_first_token_s(result, config)
    client = [r.token_times_s[0] - r.arrival_s for r in result.requests]
    # The client's TTFT has the whole front end (latency, queue, admission)
    # on top of vLLM's with the clock at the engine.
    assert all(c > e for c, e in zip(client, to_first, strict=True))
    p50, p99 = engine_ttft_quantiles(to_first, 0.0, (0.5, 0.99))
    assert p50 is not None and p99 is not None
    # The clock's lead before the engine shifts every request alike.
    q50, q99 = engine_ttft_quantiles(to_first, 0.004, (0.5, 0.99))
    assert q50 == pytest.approx(p50 + 0.004) and q99 == pytest.approx(p99 + 0.004)
    assert engine_ttft_quantiles([], 0.004, (0.5,)) == [None]


def test_the_engine_view_follows_the_clock_setting():
    replayed = Replayed(
        metrics={"ttft_p50_s": 0.05, "ttft_p99_s": 0.09, "tbt_p50_s": 0.002, "tbt_p99_s": 0.01},
        to_first_token_s=[0.01, 0.02, 0.03],
        latency_s=0.02,
    )
    fitted = replayed.engine_view(SETTINGS, 0.005)
    assert fitted["engine_ttft_p50_s"] == pytest.approx(0.025)
    assert fitted["engine_tbt_p99_s"] == 0.01
    arrival = replayed.engine_view(Settings(engine_clock="arrival"), 0.005)
    assert arrival["engine_ttft_p50_s"] == pytest.approx(0.03)
    assert arrival["engine_ttft_p99_s"] == pytest.approx(0.07)


def test_the_fit_error_is_the_sum_of_log_ratios():
    measured = {"a": 1.0, "b": 2.0}
    assert fit_error(measured, {"a": 2.0, "b": 1.0}, ("a", "b")) == pytest.approx(
        2 * 0.6931471805599453
    )
    assert fit_error(measured, {"a": 1.0, "b": 2.0}, ("a",)) == 0.0
    assert fit_error(measured, {"a": 0.0}, ("a",)) == float("inf")
