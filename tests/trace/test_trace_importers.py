"""Every converter on small hand-made files: fields, time units, drops and
changes in the summary, bad input named by file:line and column, windows."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from planner.trace import TraceError, TraceRequest
from planner.trace.arrivals import RateSchedule
from planner.trace.errors import SpecError
from planner.trace.importers.base import ImportOptions
from planner.trace.importers.pipeline import import_trace
from planner.trace.length_model import build_length_model
from planner.trace.stamp import Stamp

WriteFile = Callable[[str, str], Path]

AZURE = (
    "TIMESTAMP,ContextTokens,GeneratedTokens\n"
    "2023-11-16 18:15:46.6805900,374,44\n"
    "2023-11-16 18:15:50.9951690,396,0\n"
    "2023-11-16 18:16:46.6805901,879,55"  # no final newline, as in the code file
)


def test_azure_fields_units_and_zero_output(write_file: WriteFile) -> None:
    requests, summary = import_trace("azure", write_file("a.csv", AZURE), ImportOptions())
    assert requests == [
        TraceRequest(0.0, 374, 44),
        TraceRequest(4.314579, 396, 1),
        TraceRequest(60.0000001, 879, 55),  # 100 ns resolution kept exactly
    ]
    assert (summary.rows, summary.written) == (3, 3)
    assert summary.changed == {"GeneratedTokens 0 set to 1": 1}
    assert not summary.dropped
    assert any("changed 1 rows: GeneratedTokens 0 set to 1" in line for line in summary.lines())


def test_azure_crossing_midnight_and_month(write_file: WriteFile) -> None:
    text = (
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2023-11-30 23:59:59.5,1,1\n"
        "2023-12-01 00:00:00.25,1,1\n"
    )
    requests, _ = import_trace("azure", write_file("a.csv", text), ImportOptions())
    assert [r.arrival_s for r in requests] == [0.0, 0.75]


@pytest.mark.parametrize(
    ("row", "line", "column", "reason"),
    [
        ("2023-11-16 18:15:47,12x,5", 3, "ContextTokens", '"12x"'),
        ("2023-11-16 18:15:47,-4,5", 3, "ContextTokens", "integer >= 0"),
        ("2023-11-16 18:15:47,12,", 3, "GeneratedTokens", "integer"),
        ("16/11/2023 18:15:47,12,5", 3, "TIMESTAMP", "date and time"),
        ("2023-13-16 18:15:47,12,5", 3, "TIMESTAMP", "month"),
        ("2023-11-16 18:15:47,12,5,9", 3, None, "expected 3 cells, got 4"),
    ],
)
def test_azure_bad_rows_are_named(
    write_file: WriteFile, row: str, line: int, column: str | None, reason: str
) -> None:
    path = write_file("a.csv", AZURE.split("\n", 2)[0] + "\n2023-11-16 18:15:46,1,1\n" + row + "\n")
    with pytest.raises(TraceError) as info:
        import_trace("azure", path, ImportOptions())
    err = info.value
    assert (err.path, err.line, err.field) == (str(path), line, column)
    assert reason in err.reason


def test_missing_column_and_empty_file(write_file: WriteFile) -> None:
    with pytest.raises(TraceError, match=r"a\.csv:1: GeneratedTokens: missing column"):
        import_trace("azure", write_file("a.csv", "TIMESTAMP,ContextTokens\n"), ImportOptions())
    with pytest.raises(TraceError, match="empty file"):
        import_trace("azure", write_file("b.csv", ""), ImportOptions())
    with pytest.raises(TraceError, match="no requests in the source"):
        import_trace(
            "azure", write_file("c.csv", AZURE.split("\n", maxsplit=1)[0] + "\n"), ImportOptions()
        )


def test_unsorted_source_is_sorted_and_noted(write_file: WriteFile) -> None:
    text = (
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2023-11-16 18:00:10,1,1\n"
        "2023-11-16 18:00:00,2,2\n"
        "2023-11-16 18:00:05,3,3\n"
    )
    requests, summary = import_trace("azure", write_file("a.csv", text), ImportOptions())
    assert [(r.arrival_s, r.prompt_tokens) for r in requests] == [(0.0, 2), (5.0, 3), (10.0, 1)]
    assert any("sorted" in note for note in summary.notes)


def test_mooncake_ms_to_s_and_prefix_blocks(write_file: WriteFile) -> None:
    rows = [
        {"timestamp": 1000, "input_length": 600, "output_length": 20, "hash_ids": [0, 1]},
        {"timestamp": 1000, "input_length": 513, "output_length": 0, "hash_ids": [0, 2]},
        {"timestamp": 62500, "input_length": 10, "output_length": 3, "hash_ids": [3], "x": 1},
    ]
    path = write_file("m.jsonl", "".join(json.dumps(r) + "\n" for r in rows))
    requests, summary = import_trace("mooncake", path, ImportOptions())
    assert requests == [
        TraceRequest(0.0, 600, 20, prefix_block_ids=(0, 1)),
        TraceRequest(0.0, 513, 1, prefix_block_ids=(0, 2)),
        TraceRequest(61.5, 10, 3, prefix_block_ids=(3,)),
    ]
    assert summary.changed == {"output_length 0 set to 1": 1}
    assert any("ignored fields: x (1)" in note for note in summary.notes)


@pytest.mark.parametrize(
    ("line", "field", "reason"),
    [
        ('{"timestamp": 5, "input_length": 1.5, "output_length": 1}', "input_length", "1.5"),
        ('{"timestamp": "5", "input_length": 1, "output_length": 1}', "timestamp", "number"),
        ('{"timestamp": 5, "output_length": 1}', "input_length", "missing"),
        (
            '{"timestamp": 5, "input_length": 1, "output_length": 1, "hash_ids": [true]}',
            "hash_ids[0]",
            "integer",
        ),
        ('{"timestamp": 5, "input_length": 1,', None, "invalid JSON"),
        ("[1, 2]", None, "JSON object"),
    ],
)
def test_mooncake_bad_lines_are_named(
    write_file: WriteFile, line: str, field: str | None, reason: str
) -> None:
    good = '{"timestamp": 0, "input_length": 1, "output_length": 1, "hash_ids": [0]}'
    path = write_file("m.jsonl", f"{good}\n{line}\n")
    with pytest.raises(TraceError) as info:
        import_trace("mooncake", path, ImportOptions())
    assert (info.value.line, info.value.field) == (2, field)
    assert reason in info.value.reason


BURSTGPT = (
    "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
    "5,ChatGPT,472,18,490,Conversation log\n"
    "45,ChatGPT,1087,0,1087,Conversation log\n"
    "118,GPT-4,417,276,693,API log\n"
    "118.25,GPT-4,0,12,12,API log\n"
    "200,ChatGPT,10,10,99,Conversation log\n"
)


def test_burstgpt_fields_failures_and_checks(write_file: WriteFile) -> None:
    requests, summary = import_trace("burstgpt", write_file("b.csv", BURSTGPT), ImportOptions())
    assert requests == [
        TraceRequest(0.0, 472, 18, model="ChatGPT", tenant="Conversation log"),
        TraceRequest(113.0, 417, 276, model="GPT-4", tenant="API log"),
        TraceRequest(113.25, 1, 12, model="GPT-4", tenant="API log"),
        TraceRequest(195.0, 10, 10, model="ChatGPT", tenant="Conversation log"),
    ]
    assert summary.rows == 5
    assert summary.dropped == {"Response tokens 0 (failed request)": 1}
    assert summary.changed == {"Request tokens 0 set to 1": 1}
    assert any("1 rows have Total tokens" in note for note in summary.notes)
    assert summary.written == summary.rows - 1


def test_burstgpt_bad_timestamp(write_file: WriteFile) -> None:
    text = BURSTGPT.split("\n", 1)[0] + "\nsoon,ChatGPT,1,1,2,API log\n"
    with pytest.raises(TraceError, match=r"b\.csv:2: Timestamp: must be a finite number"):
        import_trace("burstgpt", write_file("b.csv", text), ImportOptions())


SHAREGPT = (
    "num_prefill_tokens,num_decode_tokens,num_total_tokens,pd_ratio\n"
    "74,918,992,0.08\n"
    "290,905,1195,0.32\n"
    "1402,711,2113,1.97\n"
    "5,0,5,inf\n"
)


def test_sharegpt_lengths_needs_a_rate_and_is_seeded(write_file: WriteFile) -> None:
    path = write_file("s.csv", SHAREGPT)
    with pytest.raises(SpecError, match="--rate"):
        import_trace("sharegpt-lengths", path, ImportOptions())
    options = ImportOptions(schedule=RateSchedule.constant(2.0), seed=7)
    requests, summary = import_trace("sharegpt-lengths", path, options)
    assert [(r.prompt_tokens, r.output_tokens) for r in requests] == [
        (74, 918),
        (290, 905),
        (1402, 711),
        (5, 1),
    ]
    assert requests[0].arrival_s == 0.0
    arrivals = [r.arrival_s for r in requests]
    assert arrivals == sorted(arrivals) and arrivals[-1] > 0
    assert summary.changed == {"num_decode_tokens 0 set to 1": 1}
    again, _ = import_trace("sharegpt-lengths", path, options)
    assert again == requests
    other, _ = import_trace("sharegpt-lengths", path, ImportOptions(schedule=options.schedule))
    assert [r.arrival_s for r in other] != arrivals


ALIBABA = (
    "gmt_create,predict_type,predict_status,exec_time_seconds,groupId,prompt_length,"
    "negative_prompt_length,num_images_per_prompt,num_inference_steps,"
    "checkpoint_model_version_id,num_lora\n"
    "2024-11-15 16:57:50,TXT_2_IMG,SUCCEED,32.0,G0000,63.0,26.0,1.0,30.0,M0000,0\n"
    "2024-11-15 18:16:14,TXT_2_IMG,FAILED,43.0,G0001,93.0,,1.0,40.0,M0001,0\n"
    "2024-11-26 22:50:35,TXT_2_IMG,PENDING,0.0,G0325,,,,,,0\n"
    "2024-11-27 16:57:50,IMG_2_IMG,SUCCEED,21.0,G3974,16.0,26.0,4.0,30.0,M0004,1\n"
)


def test_alibaba_models_arrivals_and_lengths_from_options(write_file: WriteFile) -> None:
    path = write_file("l.csv", ALIBABA)
    with pytest.raises(SpecError, match="no token counts"):
        import_trace("alibaba", path, ImportOptions())
    fixed = build_length_model(
        lengths=None,
        prompt_lengths="fixed:100",
        output_lengths="fixed:20",
        max_prompt_tokens=None,
        max_output_tokens=None,
        default=None,
    )
    requests, summary = import_trace("alibaba", path, ImportOptions(lengths=fixed))
    assert requests == [
        TraceRequest(0.0, 100, 20, model="M0000"),
        TraceRequest(4704.0, 100, 20, model="M0001"),
        TraceRequest(12 * 86400.0, 100, 20, model="M0004"),
    ]
    assert summary.dropped == {"no checkpoint_model_version_id": 1}
    sampled = build_length_model(
        lengths="sharegpt",
        prompt_lengths=None,
        output_lengths=None,
        max_prompt_tokens=None,
        max_output_tokens=None,
    )
    a, _ = import_trace("alibaba", path, ImportOptions(lengths=sampled, seed=1))
    b, _ = import_trace("alibaba", path, ImportOptions(lengths=sampled, seed=1))
    assert a == b and len({r.prompt_tokens for r in a}) > 1


def test_window_limit_and_stamp(write_file: WriteFile) -> None:
    text = "TIMESTAMP,ContextTokens,GeneratedTokens\n" + "".join(
        f"2023-11-16 18:00:{s:02d}.5,{s + 1},1\n" for s in range(10)
    )
    path = write_file("a.csv", text)
    requests, summary = import_trace(
        "azure", path, ImportOptions(start_s=2.5, duration_s=5.0, limit=3)
    )
    # Rows at 0..9 s from the first; window [2.5, 7.5) keeps 3..7 s, shifted
    # so that 2.5 s becomes 0; the limit keeps the first three.
    assert [(r.arrival_s, r.prompt_tokens) for r in requests] == [(0.5, 4), (1.5, 5), (2.5, 6)]
    assert (summary.outside_window, summary.over_limit) == (5, 2)
    stamped, _ = import_trace(
        "azure", path, ImportOptions(limit=2), Stamp(model="m", slo_ttft_s=1.0, id_prefix="az-")
    )
    assert stamped == [
        TraceRequest(0.0, 1, 1, id="az-0", model="m", slo_ttft_s=1.0),
        TraceRequest(1.0, 2, 1, id="az-1", model="m", slo_ttft_s=1.0),
    ]
    with pytest.raises(TraceError, match="no requests in the --start/--duration window"):
        import_trace("azure", path, ImportOptions(start_s=100.0))
    for bad in (ImportOptions(start_s=-1.0), ImportOptions(duration_s=0.0), ImportOptions(limit=0)):
        with pytest.raises(SpecError):
            import_trace("azure", path, bad)


def test_missing_source_and_unknown_format(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="cannot read"):
        import_trace("azure", tmp_path / "nope.csv", ImportOptions())
    with pytest.raises(SpecError, match="unknown format"):
        import_trace("parquet", tmp_path / "nope.csv", ImportOptions())
