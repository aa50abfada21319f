"""Every snapshot the replay hands the rotation policy is one the service
would accept: in particular no ROTARY request without a last-token time (a NaN
VLT is never picked again while contention lasts)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from planner.domain.requests import RequestState, Snapshot
from planner.domain.rotation import RotationInputs, RotationPlan
from planner.policies import rotation
from planner.replay.engine import Engine
from planner.replay.schedulers import Lvf
from planner.replay.setup import ReplayKnobs, build_setup, scale_rate
from planner.trace.io import load_trace

DEFAULT_TRACE = Path(__file__).resolve().parents[2] / "fixtures" / "traces" / "default.jsonl"


def test_lvf_snapshots_have_finite_vlts_and_rotary_times() -> None:
    seen = {"snapshots": 0, "rotary_rows": 0}

    def checked(snapshot: Snapshot, inputs: RotationInputs) -> RotationPlan:
        table = snapshot.requests
        vlt = rotation.virtual_lag_time(table, snapshot.now_s, inputs)
        assert np.isfinite(vlt).all()
        rotary = table.state == np.int8(RequestState.ROTARY)
        assert np.isfinite(table.last_token_s[rotary]).all()
        assert (table.last_token_s[rotary] <= snapshot.now_s).all()
        seen["snapshots"] += 1
        seen["rotary_rows"] += int(rotary.sum())
        return rotation.plan_rotation(snapshot, inputs)

    trace = scale_rate(load_trace(DEFAULT_TRACE)[:600], 1.0)
    setup = build_setup("llama-3-8b@h100-sxm-80gb", ReplayKnobs())
    engine = Engine(
        setup.engine,
        Lvf(setup.rotation, on_snapshots=checked),
        setup.cost,
        setup.link,
        trace,
    )
    result = engine.run()
    assert seen["snapshots"] > 0 and seen["rotary_rows"] > 0
    assert all(r.finish_s is not None for r in result.requests)
