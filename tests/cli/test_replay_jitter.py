"""`planner replay --compute-jitter CV --seed N`: seeded iteration-time noise.
The same seed gives the same numbers, another seed other numbers, and the
noise has the mean and spread asked for."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from planner.cli import main
from planner.replay.noise import JitteredAttentionPairsCost, JitteredCost

TRACE = [
    {"arrival_s": 0.02 * i, "prompt_tokens": 300 + 37 * i, "output_tokens": 40, "id": f"q{i}"}
    for i in range(40)
]


class Flat:
    def iteration_time_s(self, prefill: int, decode: int, context: int) -> float:
        return 0.0 if prefill == 0 and decode == 0 else 0.02


class Pairs:
    """Charges the prefill's attention pairs, as IterationCostModel does."""

    def iteration_time_s(
        self, prefill: int, decode: int, context: int, prefill_attention_pairs: int = 0
    ) -> float:
        return 0.01 * (prefill + decode) + 1e-6 * prefill_attention_pairs


def _run(tmp_path: Path, name: str, *args: str) -> dict[str, object]:
    trace = tmp_path / "t.jsonl"
    trace.write_text("".join(json.dumps(r) + "\n" for r in TRACE), encoding="utf-8")
    out = tmp_path / f"{name}.json"
    code = main(
        ["replay", str(trace), "--policy", "fcfs", "--quiet", "--json-out", str(out), *args]
    )
    assert code == 0
    data = json.loads(out.read_text())
    (run,) = data["policies"]
    assert run["config"]["seed"] == (int(args[-1]) if "--seed" in args else 0)
    wall_clock = {"wall_s", "sim_speed"}
    return {k: v for k, v in run["metrics"].items() if k not in wall_clock}


def test_same_seed_same_run_other_seed_other_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a = _run(tmp_path, "a", "--compute-jitter", "0.2", "--seed", "7")
    b = _run(tmp_path, "b", "--compute-jitter", "0.2", "--seed", "7")
    c = _run(tmp_path, "c", "--compute-jitter", "0.2", "--seed", "8")
    exact = _run(tmp_path, "d")
    assert a == b
    assert a != c
    assert a != exact


def test_bad_jitter_is_a_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = tmp_path / "t.jsonl"
    trace.write_text(json.dumps(TRACE[0]) + "\n", encoding="utf-8")
    assert main(["replay", str(trace), "--compute-jitter", "-1", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "--compute-jitter" in err and "Traceback" not in err


def test_noise_has_mean_one_and_the_cv_asked_for() -> None:
    cost = JitteredCost(Flat(), cv=0.3, seed=1)
    draws = np.array([cost.iteration_time_s(0, 1, 1) for _ in range(40_000)]) / 0.02
    assert draws.mean() == pytest.approx(1.0, abs=0.01)
    assert draws.std() / draws.mean() == pytest.approx(0.3, abs=0.01)
    # An idle iteration stays free.
    assert cost.iteration_time_s(0, 0, 0) == 0.0
    assert math.isclose(JitteredCost(Flat(), 0.0, 1).iteration_time_s(1, 0, 1), 0.02)


def test_the_attention_pairs_cost_draws_the_same_factors_and_passes_the_pairs() -> None:
    plain = JitteredCost(Flat(), cv=0.2, seed=7)
    paired = JitteredAttentionPairsCost(Pairs(), cv=0.2, seed=7)
    for _ in range(5000):
        factor = plain.iteration_time_s(0, 1, 1) / 0.02
        assert paired.iteration_time_s(2, 0, 2, 4000) == pytest.approx(0.024 * factor)
    # An idle iteration draws nothing and stays free.
    assert paired.iteration_time_s(0, 0, 0, 0) == 0.0
    assert JitteredAttentionPairsCost(Pairs(), 0.0, 7).iteration_time_s(2, 0, 2, 4000) == 0.024
    with pytest.raises(ValueError, match="jitter cv"):
        JitteredAttentionPairsCost(Pairs(), -1.0, 7)
