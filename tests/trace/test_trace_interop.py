"""Vidur's trace CSV in, Vidur's and vLLM's benchmark formats out: exact
rows for small files, bad input named by file:line and column with exit 2,
round trips where the format carries the fields."""

from __future__ import annotations

from pathlib import Path

import pytest
from planner_cli import run_planner

from planner.trace import TraceError, TraceRequest, write_trace
from planner.trace.exporters import EXPORTERS, export_trace
from planner.trace.importers.base import ImportOptions
from planner.trace.importers.pipeline import import_trace
from tests.trace.conftest import WriteFile

VIDUR = (
    "arrived_at,num_prefill_tokens,num_decode_tokens,num_total_tokens\n"
    "0.0,374,44,418\n"
    "4.314579,396,0,396\n"
    "5.8926549999999995,91,16,107\n"
)


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    return run_planner(capsys, "trace", *args)


def test_vidur_import_keeps_arrivals(write_file: WriteFile) -> None:
    requests, summary = import_trace("vidur", write_file("v.csv", VIDUR), ImportOptions())
    assert requests == [
        TraceRequest(0.0, 374, 44),
        TraceRequest(4.314579, 396, 1),
        TraceRequest(5.892655, 91, 16),  # to the nanosecond
    ]
    assert summary.changed == {"num_decode_tokens 0 set to 1": 1}
    assert "ignored columns: num_total_tokens" in summary.notes


def test_vidur_import_origin_is_the_first_row(write_file: WriteFile) -> None:
    text = "arrived_at,num_prefill_tokens,num_decode_tokens\n10.5,1,2\n11.0,3,4\n"
    requests, _ = import_trace("vidur", write_file("v.csv", text), ImportOptions())
    assert requests == [TraceRequest(0.0, 1, 2), TraceRequest(0.5, 3, 4)]


@pytest.mark.parametrize(
    ("row", "column", "reason"),
    [
        ("abc,1,2", "arrived_at", "finite number"),
        ("1.0,1.5,2", "num_prefill_tokens", "integer >= 0"),
        ("1.0,1,-2", "num_decode_tokens", "integer >= 0"),
    ],
)
def test_vidur_bad_cell_named_with_exit_2(
    write_file: WriteFile,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    row: str,
    column: str,
    reason: str,
) -> None:
    source = write_file("v.csv", "arrived_at,num_prefill_tokens,num_decode_tokens\n0,1,1\n" + row)
    out = tmp_path / "out.jsonl"
    code, _, err = run(capsys, "import", "--format", "vidur", str(source), "-o", str(out))
    assert code == 2
    assert err.startswith(f"planner trace import: {source}:3: {column}: ")
    assert reason in err
    assert not out.exists()


def test_vidur_lengths_only_file_points_to_sharegpt_lengths(write_file: WriteFile) -> None:
    source = write_file("s.csv", "num_prefill_tokens,num_decode_tokens,pd_ratio\n1,2,0.5\n")
    with pytest.raises(TraceError) as info:
        import_trace("vidur", source, ImportOptions())
    assert (info.value.line, info.value.field) == (1, "arrived_at")
    assert "sharegpt-lengths" in str(info.value)


TRACE = [
    TraceRequest(0.0, 3, 4, model="m", tenant="a,b"),
    TraceRequest(0.25, 5, 6, id="x"),
    TraceRequest(1.000001, 7, 8, tenant="t"),
]


def test_vidur_export_exact_rows(tmp_path: Path) -> None:
    out = tmp_path / "v.csv"
    summary = export_trace(EXPORTERS["vidur"], TRACE, out)
    assert out.read_text() == (
        "arrived_at,num_prefill_tokens,num_decode_tokens\n0.0,3,4\n0.25,5,6\n1.000001,7,8\n"
    )
    assert summary.dropped == {"id": 1, "model": 1, "tenant": 2}


def test_vllm_burstgpt_export_exact_rows(tmp_path: Path) -> None:
    out = tmp_path / "b.csv"
    summary = export_trace(EXPORTERS["vllm-burstgpt"], TRACE, out)
    assert out.read_text() == (
        "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
        '0.0,GPT-4,3,4,7,"a,b"\n'
        "0.25,GPT-4,5,6,11,Conversation log\n"
        "1.000001,GPT-4,7,8,15,t\n"
    )
    assert summary.dropped == {"id": 1, "model": 1}


def test_vidur_round_trip(tmp_path: Path) -> None:
    out = tmp_path / "v.csv"
    export_trace(EXPORTERS["vidur"], TRACE, out)
    requests, _ = import_trace("vidur", out, ImportOptions())
    assert requests == [TraceRequest(r.arrival_s, r.prompt_tokens, r.output_tokens) for r in TRACE]


def test_vllm_burstgpt_round_trip(tmp_path: Path) -> None:
    out = tmp_path / "b.csv"
    export_trace(EXPORTERS["vllm-burstgpt"], TRACE, out)
    requests, _ = import_trace("burstgpt", out, ImportOptions())
    assert requests == [
        TraceRequest(
            r.arrival_s,
            r.prompt_tokens,
            r.output_tokens,
            model="GPT-4",
            tenant=r.tenant or "Conversation log",
        )
        for r in TRACE
    ]


def test_export_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = tmp_path / "t.jsonl"
    write_trace(trace, TRACE)
    out = tmp_path / "v.csv"
    code, stdout, _ = run(capsys, "export", str(trace), "--format", "vidur", "-o", str(out))
    assert code == 0
    assert "vidur: 3 requests written" in stdout
    assert "dropped tenant (set on 2 requests): vidur does not carry it" in stdout
    assert import_trace("vidur", out, ImportOptions())[0][2] == TraceRequest(1.000001, 7, 8)


def test_export_bad_trace_named_with_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = tmp_path / "t.jsonl"
    trace.write_text(
        '{"arrival_s": 0, "prompt_tokens": 1, "output_tokens": 1}\n'
        '{"arrival_s": 1, "prompt_tokens": 0, "output_tokens": 1}\n'
    )
    out = tmp_path / "b.csv"
    code, _, err = run(capsys, "export", str(trace), "--format", "vllm-burstgpt", "-o", str(out))
    assert code == 2
    assert err.strip() == (
        f"planner trace export: {trace}:2: prompt_tokens: must be an integer >= 1, got 0"
    )
    assert not out.exists()
