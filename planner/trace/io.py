"""Read and write traces in the JSON-lines format of DESIGN.md §4.

One request per line, e.g.
``{"arrival_s": 0.52, "prompt_tokens": 812, "output_tokens": 97, "model": "llama-3-8b"}``.
Reading is strict (the rules are in `planner.trace.validate`); every problem
is a TraceError naming the file, the 1-based line and the field. A file is
first read by columns (planner.trace.fast_load), which gives the same
requests or hands the file to the line reader. Blank lines
are errors, not skipped: a trace has one JSON object on every line (the last
line may or may not end with a newline). An empty file is an error too.
Reading is bounded (planner.input_file): a regular file or standard input
("-") only, at most `max_bytes` (default MAX_TRACE_BYTES) and MAX_LINE_BYTES
per line.
Writing validates every request by the same rules first and is atomic, so
`load_trace(write_trace(...))` always succeeds and a failure midway leaves
no partial file.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from pathlib import Path

from planner.input_file import STDIN, InputFileError, display_name, read_bytes, read_lines
from planner.trace.atomic import atomic_write_lines
from planner.trace.errors import TraceError
from planner.trace.fast_load import read_trace_columns
from planner.trace.records import TraceRequest
from planner.trace.validate import (
    SequenceChecker,
    check_request,
    request_from_object,
    request_to_object,
)

# A trace line is about 100 bytes; a million-request trace about 100 MB.
MAX_TRACE_BYTES = 1 << 30
MAX_LINE_BYTES = 64 * 1024
# A source file `planner trace import` or --lengths-file converts (public
# traces are up to a few GB of CSV).
MAX_SOURCE_BYTES = 4 << 30


def _no_duplicate_keys(pairs: list[tuple[str, object]]) -> dict[str, object]:
    obj: dict[str, object] = {}
    for key, value in pairs:
        if key in obj:
            raise _DuplicateKeyError(key)
        obj[key] = value
    return obj


class _DuplicateKeyError(Exception):
    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


def parse_line(text: str, line: int) -> TraceRequest:
    """One line of a trace (without its newline) → a TraceRequest."""
    if not text.strip():
        raise TraceError(line, None, "empty line (a trace has one JSON object on every line)")
    try:
        obj = json.loads(text, object_pairs_hook=_no_duplicate_keys)
    except json.JSONDecodeError as exc:
        raise TraceError(line, None, f"invalid JSON: {exc.msg} (column {exc.colno})") from None
    except _DuplicateKeyError as exc:
        raise TraceError(line, exc.key, "field given twice") from None
    except RecursionError:
        raise TraceError(line, None, "invalid JSON: nested too deeply") from None
    return request_from_object(obj, line)


def dumps_request(request: TraceRequest) -> str:
    """The JSON line of a request (no newline); assumes a valid request."""
    return json.dumps(request_to_object(request), allow_nan=False)


def _lines(path: str | Path, max_bytes: int) -> Iterator[tuple[int, str]]:
    """(line number, text without its line ending); decoded line by line so
    that bad UTF-8 is reported on its own line."""
    name = display_name(path)
    try:
        for line, raw in read_lines(path, max_bytes, MAX_LINE_BYTES):
            data = raw.rstrip(b"\n").rstrip(b"\r")
            if line == 1 and data.startswith(b"\xef\xbb\xbf"):
                data = data[3:]
            try:
                text = data.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise TraceError(line, None, f"not UTF-8 text ({exc.reason})", path=name) from None
            yield line, text
    except InputFileError as exc:
        raise TraceError(exc.line, None, exc.reason, path=name) from None


def load_trace(
    path: str | Path, *, sort: bool = False, max_bytes: int = MAX_TRACE_BYTES
) -> list[TraceRequest]:
    """All requests of a trace file ("-": standard input), in arrival order.

    An arrival earlier than the one before it is an error naming its line,
    unless `sort` is True: then the requests are sorted by arrival (stable,
    so equal arrivals keep their file order).

    A file is read by the columnar reader first (planner.trace.fast_load);
    where that cannot vouch for it, by read_trace_lines, which names the bad
    line."""
    if str(path) != STDIN:
        try:
            data = read_bytes(path, max_bytes)
        except InputFileError:
            data = None  # read_trace_lines says why
        if data is not None:
            fast = read_trace_columns(data, sort=sort, max_line_bytes=MAX_LINE_BYTES)
            if fast is not None:
                return fast
    return read_trace_lines(path, sort=sort, max_bytes=max_bytes)


def read_trace_lines(
    path: str | Path, *, sort: bool = False, max_bytes: int = MAX_TRACE_BYTES
) -> list[TraceRequest]:
    """load_trace line by line: the strict reader, whose errors name the
    file, the line and the field."""
    name = display_name(path)
    requests: list[TraceRequest] = []
    checker = SequenceChecker(check_order=not sort)
    for line, text in _lines(path, max_bytes):
        try:
            request = parse_line(text, line)
            checker.feed(request, line)
        except TraceError as exc:
            raise exc.with_path(name) from None
        requests.append(request)
    if not requests:
        raise TraceError(None, None, "no requests (the file is empty)", path=name)
    if sort:
        requests.sort(key=lambda r: r.arrival_s)
    return requests


def write_trace(path: str | Path, requests: Iterable[TraceRequest]) -> int:
    """Write `requests` to `path` as JSON lines, atomically; returns how many.

    Every request is checked by the loader's rules (line numbers in errors are
    those the line would have had in the output); on any error, including one
    raised by the `requests` iterable itself, nothing is written and an
    existing file at `path` is left untouched."""
    count = 0

    def lines() -> Iterator[str]:
        nonlocal count
        checker = SequenceChecker()
        for line, request in enumerate(requests, start=1):
            try:
                checked = check_request(request, line)
                checker.feed(checked, line)
            except TraceError as exc:
                raise exc.with_path(path) from None
            count = line
            yield dumps_request(checked)
        if count == 0:
            raise TraceError(None, None, "no requests to write", path=path)

    atomic_write_lines(path, lines())
    return count
