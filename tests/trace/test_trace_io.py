"""The JSON-lines format: strict loading (each kind of bad line is named by
file, line and field) and atomic writing."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from planner.trace import TraceError, TraceRequest, load_trace, write_trace

GOOD = '{"arrival_s": 0, "prompt_tokens": 10, "output_tokens": 5}'


def lines_file(tmp_path: Path, *lines: str, name: str = "trace.jsonl") -> Path:
    path = tmp_path / name
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def load_error(path: Path, **kwargs: bool) -> TraceError:
    with pytest.raises(TraceError) as info:
        load_trace(path, **kwargs)
    return info.value


def test_full_record_round_trips(tmp_path: Path) -> None:
    requests = [
        TraceRequest(0.0, 10, 5),
        TraceRequest(
            1.25,
            2048,
            128,
            id="a",
            model="llama-3-8b",
            tenant="t1",
            priority=-2,
            slo_ttft_s=0.5,
            slo_tbt_s=0.05,
            prefix_block_ids=(0, 1, 2),
        ),
        TraceRequest(1.25, 1, 1, id="b"),
    ]
    path = tmp_path / "t.jsonl"
    assert write_trace(path, requests) == 3
    assert load_trace(path) == requests
    first, second, _ = path.read_text().splitlines()
    # Unset optional fields are left out; the order of keys is the spec's.
    assert json.loads(first) == {"arrival_s": 0.0, "prompt_tokens": 10, "output_tokens": 5}
    assert list(json.loads(second)) == [
        "arrival_s",
        "prompt_tokens",
        "output_tokens",
        "id",
        "model",
        "tenant",
        "priority",
        "slo_ttft_s",
        "slo_tbt_s",
        "prefix_block_ids",
    ]


def test_error_message_names_file_line_and_field(tmp_path: Path) -> None:
    bad = '{"arrival_s": 1, "prompt_tokens": -3, "output_tokens": 5}'
    path = lines_file(tmp_path, *([GOOD] * 16), bad)
    err = load_error(path)
    assert (err.line, err.field) == (17, "prompt_tokens")
    assert str(err) == f"{path}:17: prompt_tokens: must be an integer >= 1, got -3"


@pytest.mark.parametrize(
    ("line", "field", "reason"),
    [
        ('{"arrival_s": 0, "prompt_tokens": 1.5, "output_tokens": 5}', "prompt_tokens", "got 1.5"),
        ('{"arrival_s": 0, "prompt_tokens": 10.0, "output_tokens": 5}', "prompt_tokens", "10.0"),
        ('{"arrival_s": 0, "prompt_tokens": true, "output_tokens": 5}', "prompt_tokens", "true"),
        ('{"arrival_s": 0, "prompt_tokens": "10", "output_tokens": 5}', "prompt_tokens", '"10"'),
        ('{"arrival_s": 0, "prompt_tokens": 0, "output_tokens": 5}', "prompt_tokens", ">= 1"),
        ('{"arrival_s": 0, "prompt_tokens": 10, "output_tokens": 0}', "output_tokens", ">= 1"),
        ('{"arrival_s": 0, "prompt_tokens": 10, "output_tokens": null}', "output_tokens", "null"),
        ('{"arrival_s": -1, "prompt_tokens": 10, "output_tokens": 5}', "arrival_s", ">= 0"),
        ('{"arrival_s": NaN, "prompt_tokens": 10, "output_tokens": 5}', "arrival_s", "finite"),
        ('{"arrival_s": Infinity, "prompt_tokens": 1, "output_tokens": 5}', "arrival_s", "finite"),
        ('{"arrival_s": false, "prompt_tokens": 10, "output_tokens": 5}', "arrival_s", "false"),
        ('{"arrival_s": "0", "prompt_tokens": 10, "output_tokens": 5}', "arrival_s", "number"),
        ('{"prompt_tokens": 10, "output_tokens": 5}', "arrival_s", "missing"),
        ('{"arrival_s": 0, "output_tokens": 5}', "prompt_tokens", "missing"),
        ('{"arrival_s": 0, "prompt_tokens": 1, "output_tokens": 5, "foo": 1}', "foo", "unknown"),
        (
            '{"arrival_s": 0, "prompt_tokens": 1, "output_tokens": 5, "arrival_s": 1}',
            "arrival_s",
            "twice",
        ),
        (
            '{"arrival_s": 0, "prompt_tokens": 1, "output_tokens": 5, "slo_ttft_s": 0}',
            "slo_ttft_s",
            "> 0",
        ),
        (
            '{"arrival_s": 0, "prompt_tokens": 1, "output_tokens": 5, "slo_tbt_s": -0.1}',
            "slo_tbt_s",
            "> 0",
        ),
        (
            '{"arrival_s": 0, "prompt_tokens": 1, "output_tokens": 5, "priority": 1.5}',
            "priority",
            "integer",
        ),
        ('{"arrival_s": 0, "prompt_tokens": 1, "output_tokens": 5, "id": 7}', "id", "string"),
        (
            '{"arrival_s": 0, "prompt_tokens": 1, "output_tokens": 5, "model": ""}',
            "model",
            "non-empty",
        ),
        (
            '{"arrival_s": 0, "prompt_tokens": 1, "output_tokens": 5, "tenant": []}',
            "tenant",
            "string",
        ),
        (
            '{"arrival_s": 0, "prompt_tokens": 1, "output_tokens": 5, "prefix_block_ids": [1, -2]}',
            "prefix_block_ids[1]",
            ">= 0",
        ),
        (
            '{"arrival_s": 0, "prompt_tokens": 1, "output_tokens": 5, "prefix_block_ids": 3}',
            "prefix_block_ids",
            "list",
        ),
        ("[0, 10, 5]", None, "JSON object"),
        ('{"arrival_s": 0, "prompt_tokens": 10,', None, "invalid JSON"),
        ("", None, "empty line"),
        ("   ", None, "empty line"),
    ],
)
def test_each_kind_of_bad_line_is_named(
    tmp_path: Path, line: str, field: str | None, reason: str
) -> None:
    path = lines_file(tmp_path, GOOD, line, GOOD)
    err = load_error(path)
    assert err.line == 2
    assert err.field == field
    assert reason in err.reason
    assert str(err).startswith(f"{path}:2: ")


def test_null_optional_field_counts_as_absent(tmp_path: Path) -> None:
    path = lines_file(
        tmp_path, '{"arrival_s": 0, "prompt_tokens": 1, "output_tokens": 5, "model": null}'
    )
    assert load_trace(path) == [TraceRequest(0.0, 1, 5)]


def test_unsorted_trace_is_an_error_unless_sorting_is_asked(tmp_path: Path) -> None:
    path = lines_file(
        tmp_path,
        '{"arrival_s": 1, "prompt_tokens": 1, "output_tokens": 1, "id": "a"}',
        '{"arrival_s": 3, "prompt_tokens": 1, "output_tokens": 1, "id": "b"}',
        '{"arrival_s": 2, "prompt_tokens": 1, "output_tokens": 1, "id": "c"}',
        '{"arrival_s": 2, "prompt_tokens": 1, "output_tokens": 1, "id": "d"}',
    )
    err = load_error(path)
    assert (err.line, err.field) == (3, "arrival_s")
    assert "non-decreasing" in err.reason and "line 2" in err.reason
    # sort=True: sorted by arrival, stable for equal arrivals.
    assert [r.id for r in load_trace(path, sort=True)] == ["a", "c", "d", "b"]


def test_duplicate_ids_are_an_error_even_when_sorting(tmp_path: Path) -> None:
    path = lines_file(
        tmp_path,
        '{"arrival_s": 1, "prompt_tokens": 1, "output_tokens": 1, "id": "x"}',
        '{"arrival_s": 0, "prompt_tokens": 1, "output_tokens": 1, "id": "x"}',
    )
    err = load_error(path, sort=True)
    assert (err.line, err.field) == (2, "id")
    assert "first on line 1" in err.reason


def test_last_line_without_newline_is_fine_but_blank_lines_are_not(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text(GOOD + "\n" + GOOD)
    assert len(load_trace(path)) == 2
    path.write_text(GOOD + "\n\n")
    assert load_error(path).line == 2


def test_empty_missing_and_non_utf8_files(tmp_path: Path) -> None:
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    assert "no requests" in str(load_error(empty))
    missing = tmp_path / "missing.jsonl"
    err = load_error(missing)
    assert err.line is None and "cannot read" in str(err)
    binary = tmp_path / "bin.jsonl"
    binary.write_bytes(GOOD.encode() + b"\n\xff\xfe\n")
    err = load_error(binary)
    assert err.line == 2 and "UTF-8" in err.reason


def test_write_checks_requests_with_the_loaders_rules(tmp_path: Path) -> None:
    path = tmp_path / "out.jsonl"
    with pytest.raises(TraceError) as info:
        write_trace(path, [TraceRequest(0.0, 10, 5), TraceRequest(1.0, 0, 5)])
    assert (info.value.line, info.value.field) == (2, "prompt_tokens")
    with pytest.raises(TraceError, match="non-decreasing"):
        write_trace(path, [TraceRequest(2.0, 10, 5), TraceRequest(1.0, 1, 5)])
    with pytest.raises(TraceError, match="must be an integer"):
        write_trace(path, [TraceRequest(0.0, np.int64(10), 5)])  # type: ignore[arg-type]
    with pytest.raises(TraceError, match="no requests"):
        write_trace(path, [])
    assert list(tmp_path.iterdir()) == []


def test_write_is_atomic_when_the_producer_fails_midway(tmp_path: Path) -> None:
    path = tmp_path / "out.jsonl"
    path.write_text("old content\n")

    def produce() -> Iterator[TraceRequest]:
        for i in range(1000):
            if i == 500:
                raise RuntimeError("converter failed midway")
            yield TraceRequest(float(i), 1, 1)

    with pytest.raises(RuntimeError):
        write_trace(path, produce())
    assert path.read_text() == "old content\n"  # the old file is untouched
    assert [p.name for p in tmp_path.iterdir()] == ["out.jsonl"]  # no temporary left
    with pytest.raises(RuntimeError):
        write_trace(tmp_path / "new.jsonl", produce())
    assert [p.name for p in tmp_path.iterdir()] == ["out.jsonl"]  # nothing half-written


def test_written_file_has_normal_permissions(tmp_path: Path) -> None:
    path = tmp_path / "out.jsonl"
    write_trace(path, [TraceRequest(0.0, 1, 1)])
    umask = os.umask(0)
    os.umask(umask)
    assert path.stat().st_mode & 0o777 == 0o666 & ~umask
