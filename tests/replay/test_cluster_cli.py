"""`planner replay --topology cluster`: the table and JSON on a tiny trace,
and bad input as exit 2 with one line on stderr (never a traceback)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from replay_cli import replay, write_trace

ROWS: list[dict[str, Any]] = [
    {"arrival_s": 0.1 * i, "prompt_tokens": 300 + 10 * i, "output_tokens": 20 + i, "id": f"r{i}"}
    for i in range(12)
]


@pytest.fixture
def trace(tmp_path: Path) -> Path:
    return write_trace(tmp_path / "c.jsonl", ROWS)


def test_table_and_json(trace: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out_json = tmp_path / "o.json"
    code, out, err = replay(
        capsys,
        str(trace),
        "--topology",
        "cluster",
        "--instances",
        "4",
        "--quiet",
        "--json-out",
        str(out_json),
    )
    assert code == 0, err
    for policy in ("kunserve", "replication", "static-pp", "kv-migration"):
        assert policy in out
    data = json.loads(out_json.read_text())
    assert data["topology"] == "cluster"
    assert [p["policy"] for p in data["policies"]] == [
        "kunserve",
        "replication",
        "static-pp",
        "kv-migration",
    ]
    for p in data["policies"]:
        assert p["metrics"]["finished"] == len(ROWS)
        assert p["cluster"]["over_capacity"] == 0
        assert p["config"]["instances"] == 4


def test_one_policy_and_knobs(trace: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = replay(
        capsys,
        str(trace),
        "--topology",
        "cluster",
        "--policy",
        "static-pp",
        "--instances",
        "3",
        "--static-group-size",
        "3",
        "--gpu-kv-gb",
        "2",
        "--link-gbps",
        "12.5",
        "--restore-hold",
        "0",
        "--quiet",
    )
    assert code == 0, err
    assert "static-pp" in out and "kunserve" not in out


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--instances", "0"], "--instances"),
        (["--instances", "2", "--static-group-size", "3"], "static_group_size"),
        (["--link-gbps", "nan"], "--link-gbps"),
        (["--restore-hold", "-1"], "--restore-hold"),
        (["--policy", "lvf"], "unknown policy"),
        (["--gpu-kv-gb", "0"], "--gpu-kv-gb"),
        (["--gpu-kv-gb", "0.0001"], "no block"),
        (["--offload-backend", "bnb"], "--offload-backend"),
        (["--compute-jitter", "-0.1"], "--compute-jitter"),
    ],
)
def test_bad_input_exits_2(
    trace: Path, args: list[str], needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = replay(capsys, str(trace), "--topology", "cluster", "--quiet", *args)
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert needle in lines[0]


def test_cluster_knobs_rejected_elsewhere(trace: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = replay(capsys, str(trace), "--instances", "4", "--quiet")
    assert code == 2
    assert "--topology cluster only" in err
