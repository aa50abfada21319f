"""The maintainer scripts behind docs/serverless.md's tables reach into the
serverless engine; they run here on a tiny multi-model trace, so an engine
change that breaks one fails in the tests, not in a reader's hands."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from replay_cli import write_trace

SCRIPTS = Path(__file__).resolve().parents[2] / "docs" / "serverless"

ROWS = [
    {
        "arrival_s": 0.2 * (i % 6) + 0.01 * i,
        "prompt_tokens": 150 + 10 * i,
        "output_tokens": 4 + i % 3,
        "id": f"r{i}",
        "model": f"m{i % 4}",
    }
    for i in range(12)
]


def _run(script: str, *args: str) -> list[str]:
    done = subprocess.run(
        [sys.executable, str(SCRIPTS / script), *args],
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


def test_why_slower_splits_each_policys_decode_iterations(tmp_path: Path) -> None:
    trace = write_trace(tmp_path / "t.jsonl", ROWS)
    lines = _run(
        "why_slower.py",
        str(trace),
        "--policy",
        "c2cserve",
        "--policy",
        "dedicated",
        "--rate-scale",
        "1",
    )
    rows = {line.split(" | ")[0]: line.split(" | ") for line in lines[1:]}
    assert set(rows) == {"c2cserve", "dedicated"}
    for cells in rows.values():
        # decode iterations all / part / none resident: some were counted
        counts = [int(part.split(" ")[0]) for part in cells[3].split(" / ")]
        assert sum(counts) > 0


def test_link_bound_reports_both_shares_and_dedicated(tmp_path: Path) -> None:
    trace = write_trace(tmp_path / "t.jsonl", ROWS)
    lines = _run("link_bound.py", str(trace), "--rate-scale", "1", "--rate-scale", "4")
    rows = [json.loads(line) for line in lines]
    assert [r["scale"] for r in rows] == [1.0, 4.0]
    for r in rows:
        for name in ("c2cserve", "c2cserve_fair_share", "dedicated"):
            assert 0.0 <= r[name] <= 100.0
