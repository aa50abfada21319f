"""Calendar timestamps without a zone ("2023-11-16 18:15:46.6805900") →
integer nanoseconds, exactly. The zone does not matter for differences, and
naive times are read as UTC so no daylight-saving jump can creep in."""

from __future__ import annotations

import datetime as dt
import re
from pathlib import Path

from planner.trace.errors import show_value
from planner.trace.importers.base import source_error

_DATETIME = re.compile(r"(\d{4})-(\d{2})-(\d{2})[ T](\d{2}):(\d{2}):(\d{2})(?:\.(\d{1,9}))?")
_EPOCH_ORDINAL = dt.date(1970, 1, 1).toordinal()


def parse_datetime_ns(text: str, path: Path, line: int, column: str) -> int:
    match = _DATETIME.fullmatch(text.strip())
    if match is None:
        raise source_error(
            path,
            line,
            column,
            f"must be a date and time like 2023-11-16 18:15:46.6805900, got {show_value(text)}",
        )
    year, month, day, hour, minute, second = (int(g) for g in match.groups()[:6])
    try:
        moment = dt.datetime(year, month, day, hour, minute, second)
    except ValueError as exc:
        raise source_error(path, line, column, f"{exc}, got {show_value(text)}") from None
    fraction = match.group(7) or ""
    seconds = (moment.date().toordinal() - _EPOCH_ORDINAL) * 86400 + (
        hour * 3600 + minute * 60 + second
    )
    return seconds * 10**9 + int(fraction.ljust(9, "0") or "0")
