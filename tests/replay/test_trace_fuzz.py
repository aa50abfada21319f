"""Fuzzing the trace files `planner replay` and `planner trace stats` read:
valid traces with lines truncated, fields replaced (wrong types, NaN, huge
numbers, milliseconds instead of seconds, negative times, zero tokens),
required fields dropped, unknown fields added, lines swapped (unsorted),
blank or binary lines. The reader returns a trace that obeys the format,
or one TraceError naming the file, the line and (where one is at fault)
the field; the commands exit 2 with that one line, never a traceback.

Unsorted arrivals are refused, naming the line (`trace stats --sort` and
the serverless topology, which merges per-model traces, sort instead)."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from planner_cli import one_line, run_planner

from planner.trace.errors import TraceError
from planner.trace.io import load_trace
from planner.trace.validate import FIELDS, MAX_ARRIVAL_S, MAX_TOKENS, REQUIRED_FIELDS

BASE: list[dict[str, object]] = [
    {"arrival_s": 0.0, "prompt_tokens": 512, "output_tokens": 20, "id": "a"},
    {"arrival_s": 0.05, "prompt_tokens": 1500, "output_tokens": 8, "id": "b", "priority": 1},
    {"arrival_s": 0.1, "prompt_tokens": 64, "output_tokens": 30, "id": "c", "slo_ttft_s": 1.0},
    {"arrival_s": 0.2, "prompt_tokens": 300, "output_tokens": 5, "prefix_block_ids": [1, 2]},
]
# Values spliced into a line as JSON text (NaN and 1e400 are not JSON json.dumps writes).
BAD_VALUES = [
    "NaN",
    "Infinity",
    "-Infinity",
    "1e400",
    "1.7e12",
    "1700000000.5",
    "-1",
    "-0.5",
    "0",
    "1.5",
    "2.0",
    "true",
    "null",
    '"12"',
    '""',
    "[]",
    "{}",
    "[1, -2]",
    "99999999999999999999999999",
    str(MAX_TOKENS + 1),
]
SETTINGS = settings(
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


def lines_of(rows: list[dict[str, object]]) -> list[bytes]:
    return [json.dumps(r).encode() for r in rows]


def _as_row(line: bytes) -> dict[str, object]:
    """The object on a line, or {} where an earlier mutation broke it."""
    try:
        obj = json.loads(line)
    except ValueError:
        return {}
    return dict(obj) if isinstance(obj, dict) else {}


@st.composite
def mutated_trace(draw: st.DrawFn) -> bytes:
    """BASE as JSON lines with one to three mutations."""
    lines = lines_of(BASE)
    for _ in range(draw(st.integers(1, 3))):
        i = draw(st.integers(0, len(lines) - 1))
        kind = draw(
            st.sampled_from(
                [
                    "value",
                    "value",
                    "value",
                    "drop",
                    "unknown",
                    "truncate",
                    "swap",
                    "blank",
                    "binary",
                ]
            )
        )
        if kind in ("value", "drop", "unknown"):
            row = _as_row(lines[i])
            key = draw(st.sampled_from(FIELDS if kind == "value" else REQUIRED_FIELDS))
            if kind == "drop":
                row.pop(key, None)
                lines[i] = json.dumps(row).encode()
                continue
            if kind == "unknown":
                key = draw(st.sampled_from(["arrival_ms", "prompt", "", "ARRIVAL_S"]))
            row[key] = "\u2603"
            value = draw(st.sampled_from(BAD_VALUES))
            lines[i] = json.dumps(row).replace('"\\u2603"', value).encode()
        elif kind == "truncate":
            lines[i] = lines[i][: draw(st.integers(0, max(len(lines[i]) - 1, 0)))]
        elif kind == "swap":
            j = draw(st.integers(0, len(lines) - 1))
            lines[i], lines[j] = lines[j], lines[i]
        elif kind == "blank":
            lines[i] = b""
        else:
            lines[i] = draw(st.binary(min_size=1, max_size=24))
    text = b"\n".join(lines)
    return text if draw(st.booleans()) else text + b"\n"


def assert_obeys_the_format(trace: list) -> None:
    arrivals = [r.arrival_s for r in trace]
    assert arrivals == sorted(arrivals)
    for r in trace:
        assert 0 <= r.arrival_s <= MAX_ARRIVAL_S
        assert 1 <= r.prompt_tokens <= MAX_TOKENS and 1 <= r.output_tokens <= MAX_TOKENS


@settings(SETTINGS, max_examples=300)
@given(data=mutated_trace())
def test_reader_returns_a_valid_trace_or_names_the_line(tmp_path, data):
    path = tmp_path / "fuzzed.jsonl"
    path.write_bytes(data)
    try:
        trace = load_trace(path)
    except TraceError as exc:
        assert exc.path == str(path)
        # The file is never empty here: some line is at fault.
        assert exc.line is not None and 1 <= exc.line <= data.count(b"\n") + 1, str(exc)
        assert str(exc).startswith(f"{path}:{exc.line}: ")
        return
    assert_obeys_the_format(trace)


@settings(SETTINGS, max_examples=40)
@given(data=mutated_trace())
def test_trace_stats_exits_0_or_2_with_one_line(tmp_path, capsys, data):
    path = tmp_path / "fuzzed.jsonl"
    path.write_bytes(data)
    code, _, err = run_planner(capsys, "trace", "stats", str(path))
    assert code in (0, 2)
    if code == 2:
        one_line(err, f"planner trace stats: {path}:")


CASES: list[tuple[str, bytes, str]] = [
    (
        "truncated_last_line",
        b'{"arrival_s": 0, "prompt_tokens": 10, "output_tokens": 2}\n{"arrival_s": 0.5, "prompt',
        ":2: invalid JSON",
    ),
    ("invalid_json", b'{"arrival_s": 0, prompt_tokens: 10}\n', ":1: invalid JSON"),
    ("missing_required", b'{"arrival_s": 0, "prompt_tokens": 10}\n', ":1: output_tokens: required"),
    (
        "milliseconds",
        b'{"arrival_s": 1.7e12, "prompt_tokens": 10, "output_tokens": 2}\n',
        ":1: arrival_s: must be seconds from the trace's start",
    ),
    (
        "unix_timestamp",
        b'{"arrival_s": 1700000000.25, "prompt_tokens": 10, "output_tokens": 2}\n',
        "milliseconds or a Unix timestamp?",
    ),
    (
        "negative_time",
        b'{"arrival_s": -0.5, "prompt_tokens": 10, "output_tokens": 2}\n',
        ":1: arrival_s: must be a finite number >= 0",
    ),
    (
        "nan_time",
        b'{"arrival_s": NaN, "prompt_tokens": 10, "output_tokens": 2}\n',
        ":1: arrival_s: must be a finite number >= 0",
    ),
    (
        "zero_tokens",
        b'{"arrival_s": 0, "prompt_tokens": 10, "output_tokens": 0}\n',
        ":1: output_tokens: must be an integer >= 1",
    ),
    (
        "float_tokens",
        b'{"arrival_s": 0, "prompt_tokens": 10.5, "output_tokens": 2}\n',
        ":1: prompt_tokens: must be an integer >= 1",
    ),
    (
        "huge_tokens",
        b'{"arrival_s": 0, "prompt_tokens": 100000000000000000000, "output_tokens": 2}\n',
        f":1: prompt_tokens: must be an integer <= {MAX_TOKENS}",
    ),
    (
        "huge_output",
        b'{"arrival_s": 0, "prompt_tokens": 10, "output_tokens": 10000000000000}\n',
        f":1: output_tokens: must be an integer <= {MAX_TOKENS}",
    ),
    (
        "huge_priority",
        b'{"arrival_s": 0, "prompt_tokens": 1, "output_tokens": 2, "priority": 1e400}\n',
        ":1: priority: must be an integer",
    ),
    (
        "unsorted",
        b'{"arrival_s": 1, "prompt_tokens": 10, "output_tokens": 2}\n'
        b'{"arrival_s": 0.5, "prompt_tokens": 10, "output_tokens": 2}\n',
        ":2: arrival_s: arrivals must be non-decreasing",
    ),
    ("empty_file", b"", ": no requests (the file is empty)"),
    ("binary_garbage", b"\xff\xfe\x00\x81garbage\n" + bytes(range(256)), ":1: not UTF-8 text"),
    ("blank_line", b'{"arrival_s": 0, "prompt_tokens": 1, "output_tokens": 2}\n\n', ":2: empty"),
]


@pytest.mark.parametrize(("data", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_replay_names_the_line_and_field(tmp_path, capsys, data, expected):
    path = tmp_path / "bad.jsonl"
    path.write_bytes(data)
    code, out, err = run_planner(capsys, "replay", str(path), "--policy", "fcfs", "--quiet")
    assert code == 2 and out == ""
    line = one_line(err, f"planner replay: {path}")
    assert expected in line, line


@pytest.mark.parametrize(("data", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_trace_stats_names_the_line_and_field(tmp_path, capsys, data, expected):
    path = tmp_path / "bad.jsonl"
    path.write_bytes(data)
    code, out, err = run_planner(capsys, "trace", "stats", str(path))
    assert code == 2 and out == ""
    line = one_line(err, f"planner trace stats: {path}")
    assert expected in line, line


def test_unsorted_arrivals_are_sorted_where_asked(tmp_path, capsys):
    path = tmp_path / "unsorted.jsonl"
    path.write_bytes(b"\n".join(lines_of([BASE[2], BASE[0], BASE[1]])) + b"\n")
    assert [r.id for r in load_trace(path, sort=True)] == ["a", "b", "c"]
    code, out, _ = run_planner(capsys, "trace", "stats", str(path), "--sort")
    assert code == 0 and out


def test_a_trace_at_the_limits_replays(tmp_path, capsys):
    path = tmp_path / "edge.jsonl"
    rows = [
        {"arrival_s": 0.0, "prompt_tokens": 1, "output_tokens": 1},
        {"arrival_s": MAX_ARRIVAL_S, "prompt_tokens": 1, "output_tokens": 1},
    ]
    path.write_bytes(b"\n".join(lines_of(rows)))
    code, _, err = run_planner(capsys, "replay", str(path), "--policy", "fcfs", "--quiet")
    assert code == 0, err
