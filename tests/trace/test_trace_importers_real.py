"""Every converter on its real public file in ../shared/traces (skipped when
the file is absent): counts equal the source rows minus the documented
drops, times are in the right units (first and last arrival), fields are
carried over row by row, and the written trace loads back identical."""

from __future__ import annotations

import csv
import datetime as dt
import json
import math
from collections.abc import Callable
from pathlib import Path

import pytest

from planner.trace import TraceRequest, load_trace, write_trace
from planner.trace.arrivals import RateSchedule
from planner.trace.importers.base import ImportOptions, ImportSummary
from planner.trace.importers.pipeline import import_trace
from planner.trace.length_model import build_length_model
from planner.trace.stats import compute_stats

SharedTrace = Callable[[str], Path]


def csv_dicts(path: Path) -> list[dict[str, str]]:
    with path.open(newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def seconds_between(a: str, b: str) -> float:
    fmt = "%Y-%m-%d %H:%M:%S.%f" if "." in a else "%Y-%m-%d %H:%M:%S"
    # %f takes at most 6 digits: the 7th of Azure's stamps is 100 ns.
    first = dt.datetime.strptime(a[:26] if "." in a else a, fmt)
    last = dt.datetime.strptime(b[:26] if "." in b else b, fmt)
    return (last - first).total_seconds()


def round_trip(tmp_path: Path, requests: list[TraceRequest]) -> None:
    out = tmp_path / "out.jsonl"
    assert write_trace(out, requests) == len(requests)
    assert load_trace(out) == requests


def no_changes(summary: ImportSummary) -> None:
    assert not summary.dropped and not summary.changed


@pytest.mark.parametrize(
    ("name", "rows", "minutes"),
    [
        ("AzureLLMInferenceTrace_conv.csv", 19_366, 58.4),
        ("AzureLLMInferenceTrace_code.csv", 8_819, 57.3),
    ],
)
def test_azure(
    shared_trace: SharedTrace, tmp_path: Path, name: str, rows: int, minutes: float
) -> None:
    path = shared_trace(name)
    source = csv_dicts(path)
    requests, summary = import_trace("azure", path, ImportOptions())
    assert len(source) == rows == summary.rows == len(requests)
    no_changes(summary)
    assert requests[0].arrival_s == 0.0
    expected_last = seconds_between(source[0]["TIMESTAMP"], source[-1]["TIMESTAMP"])
    assert requests[-1].arrival_s == pytest.approx(expected_last, abs=1e-6)
    assert requests[-1].arrival_s / 60 == pytest.approx(minutes, abs=0.05)
    assert [r.prompt_tokens for r in requests] == [int(s["ContextTokens"]) for s in source]
    assert [r.output_tokens for r in requests] == [int(s["GeneratedTokens"]) for s in source]
    round_trip(tmp_path, requests)


def test_azure_conv_exact_last_arrival(shared_trace: SharedTrace) -> None:
    # 2023-11-16 18:15:46.6805900 → 19:14:08.4025270: 58 min 21.721937 s.
    requests, _ = import_trace(
        "azure", shared_trace("AzureLLMInferenceTrace_conv.csv"), ImportOptions()
    )
    assert requests[-1].arrival_s == 3501.721937


@pytest.mark.parametrize(
    ("name", "rows", "last_s"),
    [
        ("mooncake_conversation_trace.jsonl", 12_031, 3536.999),
        ("mooncake_synthetic_trace.jsonl", 3_993, 1022.025),
    ],
)
def test_mooncake(
    shared_trace: SharedTrace, tmp_path: Path, name: str, rows: int, last_s: float
) -> None:
    path = shared_trace(name)
    with path.open(encoding="utf-8") as f:
        source = [json.loads(line) for line in f]
    requests, summary = import_trace("mooncake", path, ImportOptions())
    assert len(source) == rows == summary.rows == len(requests)
    no_changes(summary)
    assert requests[0].arrival_s == 0.0
    assert requests[-1].arrival_s == last_s  # milliseconds → seconds
    assert requests[-1].arrival_s == (source[-1]["timestamp"] - source[0]["timestamp"]) / 1000
    for request, row in zip(requests, source, strict=True):
        assert request.prompt_tokens == row["input_length"]
        assert request.output_tokens == row["output_length"]
        assert list(request.prefix_block_ids) == row["hash_ids"]
        # One id per 512-token block, as the README says.
        assert len(request.prefix_block_ids) == math.ceil(request.prompt_tokens / 512)
    round_trip(tmp_path, requests)


def test_sharegpt_lengths(shared_trace: SharedTrace, tmp_path: Path) -> None:
    path = shared_trace("sharegpt_8k_filtered_stats_llama2_tokenizer.csv")
    source = csv_dicts(path)
    options = ImportOptions(schedule=RateSchedule.constant(10.0), seed=0)
    requests, summary = import_trace("sharegpt-lengths", path, options)
    assert len(source) == 30_731 == summary.rows == len(requests)
    no_changes(summary)
    assert [r.prompt_tokens for r in requests] == [int(s["num_prefill_tokens"]) for s in source]
    assert [r.output_tokens for r in requests] == [int(s["num_decode_tokens"]) for s in source]
    stats = compute_stats(requests)
    assert stats.mean_rate_rps == pytest.approx(10.0, rel=0.03)
    assert stats.interarrival_cv == pytest.approx(1.0, abs=0.03)
    round_trip(tmp_path, requests)


def test_alibaba(shared_trace: SharedTrace, tmp_path: Path) -> None:
    path = shared_trace("alibaba_GenTD26_lora_request_trace.csv")
    source = csv_dicts(path)
    kept = [s for s in source if s["checkpoint_model_version_id"]]
    lengths = build_length_model(
        lengths="sharegpt",
        prompt_lengths=None,
        output_lengths=None,
        max_prompt_tokens=None,
        max_output_tokens=None,
    )
    requests, summary = import_trace("alibaba", path, ImportOptions(lengths=lengths))
    assert len(source) == 26_823 == summary.rows
    assert summary.dropped == {"no checkpoint_model_version_id": 25}
    assert len(requests) == len(kept) == 26_823 - 25
    assert [r.model for r in requests] == [s["checkpoint_model_version_id"] for s in kept]
    assert len({r.model for r in requests}) == 86
    assert requests[0].arrival_s == 0.0
    expected_last = seconds_between(source[0]["gmt_create"], kept[-1]["gmt_create"])
    assert requests[-1].arrival_s == expected_last == 1_989_367.0  # ~23 days, in seconds
    round_trip(tmp_path, requests)


def test_alibaba_one_day_window(shared_trace: SharedTrace) -> None:
    path = shared_trace("alibaba_GenTD26_lora_request_trace.csv")
    lengths = build_length_model(
        lengths=None,
        prompt_lengths="fixed:64",
        output_lengths="fixed:1",
        max_prompt_tokens=None,
        max_output_tokens=None,
        default=None,
    )
    options = ImportOptions(lengths=lengths, start_s=7 * 86400.0, duration_s=86400.0)
    requests, summary = import_trace("alibaba", path, options)
    assert 0 < len(requests) < 26_798
    assert all(0 <= r.arrival_s < 86400 for r in requests)
    assert summary.outside_window + len(requests) == 26_798


def test_an_absent_public_trace_skips(shared_trace: SharedTrace) -> None:
    with pytest.raises(pytest.skip.Exception, match="not found"):
        shared_trace("no_such_trace.csv")
