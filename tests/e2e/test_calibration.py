"""The calibration check at a small size (a few minutes on 2 cores): a real
vLLM server profiled by `planner profile`, two loads served by vLLM's own
scheduler and by the rotation plugin, each replayed by `planner replay` with
the measured profile. What it asserts holds on a shared 2-core machine: the
pipeline runs, every request completes, the profile is a valid measured
profile, every compared number has its relative error, and the loose bounds
below; the measured errors themselves are in docs/replay.md."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from planner.bench.calibration import (
    ALL_KEYS,
    ENGINE_TARGET_METRICS,
    SIDES,
    TARGET_METRICS,
    Settings,
    markdown,
    measure,
    predict,
    targets,
)
from planner.bench.calibration_loads import QUICK_LOADS
from planner.profiles.loading import load_profile

from .conftest import free_port

pytestmark = pytest.mark.e2e

# Throughput is bound by the arrivals on both loads; anything beyond this
# means the replay or the measurement is broken, not noisy.
THROUGHPUT_BOUND = 0.5


def test_calibration_runs_end_to_end_and_reports_every_error(
    tiny_model: Path, tmp_path: Path
) -> None:
    loads = [QUICK_LOADS["steady"], QUICK_LOADS["bursts"]]
    # The front end's streaming work is fitted per run and may pace the
    # quick bursts' admissions below the pool's size in the replay; the fit
    # has its own tests, and without it the replay's bursts must overflow.
    # vLLM's TTFT clock is still fitted (the default): every engine row has
    # a prediction.
    settings = Settings(quick=True, profile_repeats=1, stream_work="none")
    measurement = measure(
        settings,
        loads,
        1,
        tmp_path,
        python=sys.executable,
        port=free_port(),
        model_dir=tiny_model,
        progress=lambda message: None,
        command="pytest tests/e2e/test_calibration.py",
    )
    cal = predict(measurement, tmp_path, progress=lambda message: None)
    assert {(s.load, s.side) for s in cal.sides} == {
        (load.name, side) for load in loads for side, _ in SIDES
    }
    for s in cal.sides:
        load = QUICK_LOADS[s.load]
        assert s.requests == len(load.requests(salt=0)) and s.failed == 0, s
        for key in ALL_KEYS:
            assert s.predicted[key] is not None, (s.load, s.side, key)
        for key in (*TARGET_METRICS, "goodput"):
            assert s.measured[key] is not None, (s.load, s.side, key)
        assert s.error("throughput_tok_s") is not None
        assert abs(s.error("throughput_tok_s")) < THROUGHPUT_BOUND, s
        # vLLM's own TBT histogram saw the run's tokens.
        assert s.measured["engine_tbt_p50_s"] is not None
    bursts = {s.side: s for s in cal.sides if s.load == "bursts"}
    # The bursts overflow the KV pool, in the engine and in the replay.
    assert bursts["vllm"].engine_counters["preemptions"] > 0
    assert bursts["vllm"].predicted["preemptions"] > 0
    # With the plugin the bursts overflow too; vLLM's own preemptions are
    # recomputed as without it, so only a plan the planner was asked for
    # (only while a running request could be a victim: maybe never) swaps.
    rotation = bursts["rotation"].engine_counters
    assert rotation["preemptions"] > 0
    if rotation.get("planner_calls", 0) == 0:
        assert rotation.get("swap_outs", 0) == 0

    [profile_info] = cal.profiles
    profile = load_profile(profile_info["path"])
    assert profile.provenance["kind"] == "measured"
    assert "synthetic batches" in profile.provenance["method"]
    (model,) = profile.models
    constants = profile.cost[(model, 1)]
    assert constants["overhead_s"] + constants["decode_s_per_token"] > 0
    assert profile.request_latency_s(model) >= 0
    # vLLM serves its inter-token histogram: the decode probes' step spread
    # is measured.
    assert "step_jitter_cv" in profile.extra_terms[(model, 1)]

    text = markdown(cal, loads)
    verdicts = targets(cal.sides, [load.name for load in loads])
    assert len(verdicts) == len(loads) * (len(TARGET_METRICS) + len(ENGINE_TARGET_METRICS) + 1)
    for what, _, numbers in verdicts:
        assert what in text and numbers in text
