"""Golden results: every topology and policy replayed on small traces with
pressure (preemptions, swaps, offload, buddy groups, model switches), each
request's outcome compared with the recorded one. A change to the replay's
results must be deliberate: re-record with

    PLANNER_RECORD_GOLDEN=1 .venv/bin/python -m pytest tests/replay/test_golden.py

and name the change in the commit and the docs."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from planner.cli import main
from planner.replay.request_table import COLUMNS

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = Path(__file__).resolve().parent / "golden"
RECORD = os.environ.get("PLANNER_RECORD_GOLDEN") == "1"
DEFAULT_TRACE = ROOT / "fixtures" / "traces" / "default.jsonl"
LONGCTX_TRACE = ROOT / "fixtures" / "traces" / "longctx.jsonl"


def head(lines: int) -> str:
    with DEFAULT_TRACE.open(encoding="utf-8") as f:
        return "".join(next(f) for _ in range(lines))


def multi_model(requests: int, models: int) -> str:
    """Arrivals in bursts, most of them for a few popular models."""
    rng = np.random.default_rng(11)
    arrival = np.cumsum(rng.exponential(0.15, requests))
    popular = rng.zipf(1.6, requests) % models
    rows = [
        {
            "arrival_s": round(float(arrival[i]), 6),
            "prompt_tokens": int(rng.integers(64, 2048)),
            "output_tokens": int(rng.integers(8, 256)),
            "id": f"r{i}",
            "model": f"m{int(popular[i])}",
        }
        for i in range(requests)
    ]
    return "".join(json.dumps(r) + "\n" for r in rows)


def with_shared_prefixes(text: str, block_tokens: int) -> str:
    """The requests of `text` with prefix_block_ids: most begin with one of a
    few shared prefixes (1 to 8 blocks, popular ones more often), the rest of
    each prompt its own."""
    rng = np.random.default_rng(5)
    prefixes = [[1000 * p + b for b in range(int(rng.integers(1, 9)))] for p in range(6)]
    fresh = 10**6
    rows = []
    for line in text.splitlines():
        row = json.loads(line)
        blocks = -(-int(row["prompt_tokens"]) // block_tokens)
        pick = int(rng.zipf(1.5)) - 1
        ids = list(prefixes[pick][:blocks]) if pick < len(prefixes) else []
        while len(ids) < blocks:
            ids.append(fresh)
            fresh += 1
        rows.append({**row, "prefix_block_ids": ids})
    return "".join(json.dumps(r) + "\n" for r in rows)


CASES: dict[str, tuple[str, list[str]]] = {
    "rotation": (
        head(300),
        [
            "--profile",
            "qwen2.5-32b@gh200-96gb",
            "--rate-scale",
            "2",
            "--compute-jitter",
            "0.05",
            "--seed",
            "3",
            *(
                f"--policy={name}"
                for name in ("fcfs", "lvf", "lvf-paper", "waiting-first", "swapped-first", "cfs")
            ),
        ],
    ),
    "rotation-prefix-cache": (
        with_shared_prefixes(head(300), 256),
        [
            "--profile",
            "qwen2.5-32b@gh200-96gb",
            "--rate-scale",
            "2",
            "--prefix-cache",
            "on",
            "--prefix-block-tokens",
            "256",
            *(f"--policy={name}" for name in ("fcfs", "lvf", "waiting-first")),
        ],
    ),
    "long-context": (
        LONGCTX_TRACE.read_text(encoding="utf-8"),
        # Solves stop on their node limit alone, never on the clock.
        ["--topology", "long-context", "--offload-time-limit", "1000"],
    ),
    "cluster": (
        head(300),
        ["--topology", "cluster", "--instances", "4", "--gpu-kv-gb", "1", "--rate-scale", "6"],
    ),
    "serverless": (multi_model(160, 6), ["--topology", "serverless"]),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_replay_matches_its_golden_results(
    case: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    text, args = CASES[case]
    trace = tmp_path / "trace.jsonl"
    trace.write_text(text, encoding="utf-8")
    out = tmp_path / "requests.csv"
    code = main(["replay", str(trace), "--quiet", "--requests-out", str(out), *args])
    _, err = capsys.readouterr()
    assert code == 0, err
    got = pd.read_csv(out)
    assert list(got.columns) == list(COLUMNS)
    golden = GOLDEN / f"{case}.csv.gz"
    if RECORD:
        got.to_csv(golden, index=False, compression={"method": "gzip", "mtime": 0})
    assert golden.exists(), f"no golden results for {case}: record them (see the module doc)"
    want = pd.read_csv(golden)
    assert len(got) == len(want), f"{case}: {len(got)} rows, golden {len(want)}"
    for column in COLUMNS:
        a, b = got[column].to_numpy(), want[column].to_numpy()
        if np.issubdtype(b.dtype, np.floating):
            same = np.isclose(a, b, rtol=1e-12, atol=1e-12, equal_nan=True)
        else:
            same = a == b
        if not same.all():
            rows = got.loc[~same, ["policy", "rate_scale", "id", column]].head(5)
            pytest.fail(
                f"{case}: {int((~same).sum())} rows differ in {column}, first:\n"
                f"{rows.to_string()}\ngolden:\n{want.loc[~same, column].head(5).to_string()}"
            )
