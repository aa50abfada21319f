"""docs/replay/paper_check.py's `whatif` (the maintainer script behind
docs/replay.md's SuperInfer paper check) still runs on the current engine: its
variants subclass the engine and the LVF scheduler at run time, so an engine
change can break them without any other test noticing. On a tiny generated
trace with contention: a shipped policy gives exactly `planner replay`'s
numbers, and a variant combining every what-if part runs and changes them."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from planner.cli import main

SCRIPT = Path(__file__).resolve().parents[2] / "docs" / "replay" / "paper_check.py"
# A small KV pool (about 1,550 blocks) and a slow link, so that 40 requests of
# the sharegpt preset contend for KV and LVF rotates.
PROFILE = "qwen2.5-32b@a100-sxm-80gb"
EVERY_PART = "lvf+freelink+nosit+keepstart+lagonly+nanfix"
# Run-time measurements, not results.
WALL_CLOCK = {"wall_s", "sim_speed"}


def load_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("paper_check", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def trace(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> Path:
    path = tmp_path / "tiny.jsonl"
    code = main(
        ["trace", "gen", "--rate", "1.5", "--num-requests", "40", "--seed", "0", "-o", str(path)]
    )
    assert code == 0
    capsys.readouterr()
    return path


def results(metrics: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in metrics.items() if k not in WALL_CLOCK}


def test_whatif_matches_replay_and_runs_a_variant(
    trace: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    script = load_script()
    rows = script.whatif(
        [str(trace), "--profile", PROFILE, "--variant", "lvf", "--variant", EVERY_PART]
    )
    out = capsys.readouterr().out
    assert [r["variant"] for r in rows] == ["lvf", EVERY_PART]
    assert EVERY_PART in out and "head blocked:" in out

    json_out = tmp_path / "replay.json"
    code = main(
        [
            "replay",
            str(trace),
            "--profile",
            PROFILE,
            "--policy",
            "lvf",
            "--json-out",
            str(json_out),
            "--quiet",
        ]
    )
    assert code == 0
    replayed = json.loads(json_out.read_text())["policies"][0]
    assert replayed["policy"] == "lvf"
    shipped, variant = rows
    assert shipped["swap_outs"] > 0  # LVF rotates on this trace
    for key in ("ttft_attainment", "tbt_attainment", "tpot_attainment"):
        assert shipped[key] == replayed["metrics"][key]
    # Every other metric too (the whatif row adds its own statistics).
    assert results(replayed["metrics"]).items() <= results(shipped).items()

    # Every part took effect: free transfers never stall, and the decisions
    # differ from the shipped policy's.
    assert variant["stall_fraction"] == 0.0 < shipped["stall_fraction"]
    assert variant["swap_outs"] != shipped["swap_outs"]
    for row in rows:
        assert sum(row["head_blocked_by"].values()) == pytest.approx(1.0)


def test_variant_names_are_checked() -> None:
    script = load_script()
    assert script.parse_variant("lvf+nanfix") == ("lvf", ["nanfix"])
    assert script.parse_variant("fcfs+freelink+nosit") == ("fcfs", ["freelink", "nosit"])
    for bad in ("fcfs+lagonly", "waiting-first+keepstart", "lvf+nope", "nope"):
        with pytest.raises(ValueError):
            script.parse_variant(bad)
