"""The columnar readers against the strict ones: the same requests and the
same file on every good input, and on a bad one the strict reader's error
(file, line, field) exactly."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from planner.cli import main
from planner.trace import TraceError, TraceRequest, load_trace, write_trace
from planner.trace.fast_load import read_trace_columns
from planner.trace.importers.base import ImportOptions
from planner.trace.importers.pipeline import import_trace, import_trace_to_file
from planner.trace.io import MAX_LINE_BYTES, read_trace_lines
from planner.trace.stamp import Stamp
from planner.trace.validate import FIELDS, MAX_TOKENS
from tests.trace.conftest import WriteFile

HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens\r\n"
ROWS = [
    "2023-11-16 18:15:46.6805900,374,44",
    "2023-11-16 18:15:50.9951690,396,0",
    "2023-11-16 18:16:46.6805901,879,55",
    "2023-11-16 18:16:47,1,1",
]
AZURE = HEADER + "\r\n".join(ROWS) + "\r\n"
# Each example overwrites the one file it writes in tmp_path.
_SLOW_AND_TMP_PATH = [HealthCheck.too_slow, HealthCheck.function_scoped_fixture]


def strict_bytes(source: Path, options: ImportOptions, stamp: Stamp, out: Path) -> bytes:
    requests, _ = import_trace("azure", source, options, stamp)
    write_trace(out, requests)
    return out.read_bytes()


@pytest.mark.parametrize(
    ("options", "stamp"),
    [
        (ImportOptions(), Stamp()),
        (ImportOptions(start_s=4.0, duration_s=60.0), Stamp()),
        (ImportOptions(limit=2), Stamp(model="m", tenant='t"1', id_prefix="r-")),
        (ImportOptions(), Stamp(slo_ttft_s=0.5, slo_tbt_s=0.05)),
    ],
)
def test_azure_by_columns_writes_the_strict_file(
    write_file: WriteFile, tmp_path: Path, options: ImportOptions, stamp: Stamp
) -> None:
    source = write_file("a.csv", AZURE)
    out = tmp_path / "columns.jsonl"
    summary = import_trace_to_file("azure", source, options, stamp, out)
    expected = strict_bytes(source, options, stamp, tmp_path / "strict.jsonl")
    assert out.read_bytes() == expected
    _, strict_summary = import_trace("azure", source, options, stamp)
    strict_summary.written = summary.written
    assert summary.lines() == strict_summary.lines()


def test_azure_by_columns_sorts_as_the_strict_path(write_file: WriteFile, tmp_path: Path) -> None:
    source = write_file("a.csv", HEADER + "\r\n".join([ROWS[1], ROWS[0], ROWS[2]]))
    out = tmp_path / "c.jsonl"
    summary = import_trace_to_file("azure", source, ImportOptions(), Stamp(), out)
    assert "1 rows were earlier than the row before them; sorted" in summary.notes
    assert out.read_bytes() == strict_bytes(source, ImportOptions(), Stamp(), tmp_path / "s.jsonl")


@pytest.mark.parametrize(
    ("row", "column", "reason"),
    [
        ("2023-11-16 18:15:47,12x,5", "ContextTokens", '"12x"'),
        ("2023-11-16 18:15:47,+12,5", "ContextTokens", "integer >= 0"),
        ("2023-11-16 18:15:47,-4,5", "ContextTokens", "integer >= 0"),
        ("2023-11-16 18:15:47,12,", "GeneratedTokens", "integer"),
        ("2023-02-30 18:15:47,12,5", "TIMESTAMP", "day is out of range"),
        ("2023-11-16 25:15:47,12,5", "TIMESTAMP", "hour"),
        ("16/11/2023 18:15:47,12,5", "TIMESTAMP", "date and time"),
        ("2023-11-16 18:15:47,12", None, "expected 3 cells"),
    ],
)
def test_bad_azure_row_is_named_as_before(
    write_file: WriteFile,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    row: str,
    column: str | None,
    reason: str,
) -> None:
    source = write_file("a.csv", HEADER + ROWS[0] + "\r\n" + row + "\r\n" + ROWS[2] + "\r\n")
    out = tmp_path / "out.jsonl"
    code = main(["trace", "import", "--format", "azure", str(source), "-o", str(out)])
    err = capsys.readouterr().err
    assert code == 2
    where = f"{source}:3" + (f": {column}" if column else "")
    assert err.startswith(f"planner trace import: {where}: "), err
    assert reason in err
    assert not out.exists()


def test_token_count_over_the_limit_is_named_by_its_output_line(
    write_file: WriteFile, tmp_path: Path
) -> None:
    source = write_file("a.csv", HEADER + f"2023-11-16 18:15:47,{MAX_TOKENS + 1},5\r\n")
    with pytest.raises(TraceError) as info:
        import_trace_to_file("azure", source, ImportOptions(), Stamp(), tmp_path / "o.jsonl")
    assert (info.value.line, info.value.field) == (1, "prompt_tokens")


def test_blank_lines_are_skipped_and_noted_as_before(write_file: WriteFile, tmp_path: Path) -> None:
    source = write_file("a.csv", HEADER + ROWS[0] + "\r\n\r\n" + ROWS[2] + "\r\n")
    out = tmp_path / "o.jsonl"
    summary = import_trace_to_file("azure", source, ImportOptions(), Stamp(), out)
    assert "skipped 1 blank lines" in summary.notes
    assert [r.prompt_tokens for r in load_trace(out)] == [374, 879]


_optional = {
    "id": st.text(min_size=1, max_size=8),
    "model": st.sampled_from(["llama-3-8b", "m", "é"]),
    "tenant": st.text(min_size=1, max_size=4),
    "priority": st.integers(-(2**63), 2**63 - 1),
    "slo_ttft_s": st.floats(min_value=1e-9, max_value=1e3),
    "slo_tbt_s": st.floats(min_value=1e-9, max_value=1e3),
    "prefix_block_ids": st.lists(st.integers(0, 2**63 - 1), max_size=4).map(tuple),
}


@st.composite
def traces(draw: st.DrawFn) -> list[TraceRequest]:
    gaps = draw(st.lists(st.floats(0, 1e3, allow_subnormal=False), min_size=1, max_size=30))
    fields = draw(st.sets(st.sampled_from(sorted(_optional))))
    requests = []
    arrival = 0.0
    for index, gap in enumerate(gaps):
        arrival += gap
        extra = {name: draw(_optional[name]) for name in fields if draw(st.booleans())}
        if "id" in extra:
            extra["id"] = f"{extra['id']}{index}"  # unique
        requests.append(
            TraceRequest(
                arrival,
                draw(st.integers(1, MAX_TOKENS)),
                draw(st.integers(1, MAX_TOKENS)),
                **extra,  # type: ignore[arg-type]
            )
        )
    return requests


@settings(max_examples=150, deadline=None, suppress_health_check=_SLOW_AND_TMP_PATH)
@given(trace=traces())
def test_load_of_save_is_the_trace_by_columns(tmp_path: Path, trace: list[TraceRequest]) -> None:
    path = tmp_path / "t.jsonl"
    write_trace(path, trace)
    data = path.read_bytes()
    ascii_only = data.isascii()
    by_columns = read_trace_columns(data, sort=False, max_line_bytes=MAX_LINE_BYTES)
    if ascii_only:
        assert by_columns == trace  # the fast path took it
    assert load_trace(path) == trace


_values = st.one_of(
    st.integers(-3, 3),
    st.integers(),
    st.floats(allow_nan=True, allow_infinity=True),
    st.booleans(),
    st.none(),
    st.text(max_size=3),
    st.lists(st.integers(-2, 2), max_size=2),
    st.just([None]),
)


@st.composite
def lines(draw: st.DrawFn) -> str:
    obj: dict[str, object] = {"arrival_s": draw(st.floats(0, 10)), "prompt_tokens": 1}
    obj["output_tokens"] = 1
    for key in draw(st.lists(st.sampled_from([*FIELDS, "x"]), max_size=3)):
        obj[key] = draw(_values)
    text = json.dumps(obj)
    if draw(st.booleans()):  # a duplicate key, a blank or a padded line
        text = draw(
            st.sampled_from(
                [text[:-1] + ', "prompt_tokens": 2}', "", " " + text, text + " ", text + ","]
            )
        )
    return text


@settings(max_examples=300, deadline=None, suppress_health_check=_SLOW_AND_TMP_PATH)
@given(trace_lines=st.lists(lines(), min_size=1, max_size=4), sort=st.booleans())
def test_columns_never_accept_what_the_strict_reader_refuses(
    tmp_path: Path, trace_lines: list[str], sort: bool
) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text("\n".join(trace_lines) + "\n", encoding="utf-8")
    by_columns = read_trace_columns(path.read_bytes(), sort=sort, max_line_bytes=MAX_LINE_BYTES)
    try:
        strict = read_trace_lines(path, sort=sort)
    except TraceError:
        assert by_columns is None
        return
    assert by_columns is None or by_columns == strict


def test_requests_read_by_columns_are_frozen_trace_requests() -> None:
    data = b'{"arrival_s": 0.5, "prompt_tokens": 2, "output_tokens": 3, "model": "m"}\n'
    (request,) = read_trace_columns(data, sort=False, max_line_bytes=MAX_LINE_BYTES) or []
    expected = TraceRequest(0.5, 2, 3, model="m")
    assert type(request) is TraceRequest
    assert request == expected and hash(request) == hash(expected)
    with pytest.raises(dataclasses.FrozenInstanceError):
        request.prompt_tokens = 4  # type: ignore[misc]
