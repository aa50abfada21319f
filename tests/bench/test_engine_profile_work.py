"""Where a measured profile charges the fitted per-request work: in the
iteration that prefills the request (prefill_s_per_sequence) or as the
admission queue in front of the engine (admission_s_per_request), and what
`planner replay` makes of each."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from planner.bench.engine_profile import (
    PER_REQUEST_ADMISSION,
    PER_REQUEST_ITERATION,
    CopyTiming,
    EngineLimits,
    EngineProfile,
    build_profile,
    model_from_config,
)
from planner.profiles.fit import CostFit, LinearCost
from planner.profiles.loading import load_profile, save_profile
from planner.replay.setup import ReplayKnobs, build_setup

CONFIG = {
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "hidden_size": 64,
    "intermediate_size": 128,
    "vocab_size": 1000,
    "torch_dtype": "bfloat16",
}
PER_REQUEST_S = 0.0017


def _result() -> EngineProfile:
    fit = CostFit(
        cost=LinearCost(2e-3, 4e-5, 5e-5, 5e-7, PER_REQUEST_S),
        latency_s=0.009,
        rows=40,
        dropped=1,
        relative_errors=np.array([0.05, -0.08]),
    )
    return EngineProfile(
        fit=fit,
        runs=[],
        copies=[CopyTiming(1, 4096, 1e-5, 1.2e-5), CopyTiming(8, 4096, 4e-5, 5e-5)],
        limits=EngineLimits(32, 128, 2048, 128, 1024),
        url="http://127.0.0.1:8000",
        served_model="m",
        rounds=3,
        started="2026-11-26T04:00:00+00:00",
        wall_s=14.0,
        load_average_before=1.0,
        load_average_after=1.5,
        failed_requests=0,
        merged_chunks=0,
    )


@pytest.mark.parametrize("per_request", [PER_REQUEST_ITERATION, PER_REQUEST_ADMISSION])
def test_the_per_request_work_goes_where_asked_and_the_replay_follows(
    per_request: str, tmp_path: Path
) -> None:
    model = model_from_config(CONFIG, "tiny")
    path = tmp_path / "engine.json"
    save_profile(build_profile(_result(), model, "tiny-engine", per_request), path)
    profile = load_profile(path)
    constants = profile.cost[("tiny", 1)]
    queued = per_request == PER_REQUEST_ADMISSION
    assert constants["prefill_s_per_sequence"] == (0.0 if queued else PER_REQUEST_S)
    assert profile.admission_s_per_request("tiny") == (PER_REQUEST_S if queued else 0.0)
    assert constants["overhead_s"] == 2e-3 and profile.request_latency_s("tiny") == 0.009
    knobs = ReplayKnobs(block_size_tokens=32, gpu_kv_blocks=128, cpu_kv_blocks=64)
    engine = build_setup(f"tiny@{path}", knobs).engine
    assert engine.admission_s_per_request == (PER_REQUEST_S if queued else 0.0)
    assert engine.prefill_s_per_sequence == (0.0 if queued else PER_REQUEST_S)
    # --admission-queue off: no queue, whatever the profile says.
    off = build_setup(f"tiny@{path}", replace(knobs, admission_queue=False)).engine
    assert off.admission_s_per_request == 0.0


def test_an_unknown_place_for_the_per_request_work_is_refused() -> None:
    with pytest.raises(ValueError, match="per_request"):
        build_profile(_result(), model_from_config(CONFIG, "tiny"), "x", "nowhere")
