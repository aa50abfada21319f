"""The rules of a trace record (DESIGN.md §4), shared by the loader and the
writer so that whatever `write_trace` writes, `load_trace` reads back.

Per field: arrival_s a finite number of seconds in [0, MAX_ARRIVAL_S] (a
year: larger values are milliseconds or Unix timestamps, refused with a
hint); prompt_tokens and output_tokens integers in [1, MAX_TOKENS]; id,
model, tenant non-empty strings; priority an int64; slo_ttft_s and slo_tbt_s
finite numbers > 0; prefix_block_ids a list of int64s >= 0. Integers are
JSON integers (1.0 and 1.5 are not, and neither are true/false); numbers
are integers or floats, never booleans. Unknown fields are rejected; an
optional field given as null counts as absent.
Across lines: arrivals non-decreasing, ids unique.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from planner.trace.errors import TraceError, show_value
from planner.trace.records import TraceRequest

REQUIRED_FIELDS = ("arrival_s", "prompt_tokens", "output_tokens")
OPTIONAL_FIELDS = (
    "id",
    "model",
    "tenant",
    "priority",
    "slo_ttft_s",
    "slo_tbt_s",
    "prefix_block_ids",
)
FIELDS = REQUIRED_FIELDS + OPTIONAL_FIELDS
MAX_ARRIVAL_S = 366 * 86_400.0
# Tokens of one request's prompt or output: far beyond any context window,
# small enough that a replay can hold per-token state for it.
MAX_TOKENS = 1 << 24
MAX_INT64 = (1 << 63) - 1


def _integer(value: object, line: int, field: str, minimum: int, maximum: int = MAX_INT64) -> int:
    if isinstance(value, int) and not isinstance(value, bool) and minimum <= value <= maximum:
        return value
    too_big = isinstance(value, int) and not isinstance(value, bool) and value > maximum
    bound = f" <= {maximum}" if too_big else f" >= {minimum}"
    raise TraceError(line, field, f"must be an integer{bound}, got {show_value(value)}")


def _number(value: object, line: int, field: str, *, positive: bool) -> float:
    if isinstance(value, int | float) and not isinstance(value, bool):
        try:
            number = float(value)
        except OverflowError:  # an integer beyond the float range
            number = math.inf
        if math.isfinite(number) and (number > 0 if positive else number >= 0):
            return number
    bound = "> 0" if positive else ">= 0"
    raise TraceError(line, field, f"must be a finite number {bound}, got {show_value(value)}")


def _arrival(value: object, line: int) -> float:
    arrival = _number(value, line, "arrival_s", positive=False)
    if arrival > MAX_ARRIVAL_S:
        raise TraceError(
            line,
            "arrival_s",
            f"must be seconds from the trace's start, at most {MAX_ARRIVAL_S:.0f} (a year), "
            f"got {show_value(value)}: milliseconds or a Unix timestamp?",
        )
    return arrival


def _string(value: object, line: int, field: str) -> str:
    if not isinstance(value, str) or not value:
        raise TraceError(line, field, f"must be a non-empty string, got {show_value(value)}")
    return value


def _block_ids(value: object, line: int, field: str) -> tuple[int, ...]:
    if not isinstance(value, list | tuple):
        raise TraceError(line, field, f"must be a list of integers >= 0, got {show_value(value)}")
    if all(type(item) is int and 0 <= item <= MAX_INT64 for item in value):  # common, fast
        return tuple(value)
    for index, item in enumerate(value):
        _integer(item, line, f"{field}[{index}]", 0)
    return tuple(value)


def request_from_object(obj: object, line: int) -> TraceRequest:
    """One decoded JSON line → a TraceRequest, or TraceError naming the
    field. The error carries no path; the caller adds it."""
    if not isinstance(obj, Mapping):
        kind = "an array" if isinstance(obj, list) else show_value(obj)
        raise TraceError(line, None, f"must be a JSON object, got {kind}")
    for key in obj:
        if key not in FIELDS:
            raise TraceError(line, str(key), f"unknown field (known: {', '.join(FIELDS)})")
    for key in REQUIRED_FIELDS:
        if key not in obj:
            raise TraceError(line, key, "required field is missing")

    def opt(key: str) -> object:
        return obj.get(key)

    def present(key: str) -> bool:
        return key in obj and obj[key] is not None

    return TraceRequest(
        arrival_s=_arrival(obj["arrival_s"], line),
        prompt_tokens=_integer(obj["prompt_tokens"], line, "prompt_tokens", 1, MAX_TOKENS),
        output_tokens=_integer(obj["output_tokens"], line, "output_tokens", 1, MAX_TOKENS),
        id=_string(opt("id"), line, "id") if present("id") else None,
        model=_string(opt("model"), line, "model") if present("model") else None,
        tenant=_string(opt("tenant"), line, "tenant") if present("tenant") else None,
        priority=(
            _integer(opt("priority"), line, "priority", -MAX_INT64 - 1)
            if present("priority")
            else None
        ),
        slo_ttft_s=(
            _number(opt("slo_ttft_s"), line, "slo_ttft_s", positive=True)
            if present("slo_ttft_s")
            else None
        ),
        slo_tbt_s=(
            _number(opt("slo_tbt_s"), line, "slo_tbt_s", positive=True)
            if present("slo_tbt_s")
            else None
        ),
        prefix_block_ids=(
            _block_ids(opt("prefix_block_ids"), line, "prefix_block_ids")
            if present("prefix_block_ids")
            else ()
        ),
    )


def request_to_object(request: TraceRequest) -> dict[str, object]:
    """The JSON object of one line: fields in the order of FIELDS, optional
    ones left out when unset (None, or no prefix blocks)."""
    obj: dict[str, object] = {
        "arrival_s": request.arrival_s,
        "prompt_tokens": request.prompt_tokens,
        "output_tokens": request.output_tokens,
    }
    for key in OPTIONAL_FIELDS:
        value = getattr(request, key)
        if key == "prefix_block_ids":
            if value:
                obj[key] = list(value)
        elif value is not None:
            obj[key] = value
    return obj


def check_request(request: TraceRequest, line: int) -> TraceRequest:
    """A TraceRequest built in code must obey the same rules as one read from
    a file (a numpy integer, for one, is not an int here)."""
    return request_from_object(request_to_object(request), line)


class SequenceChecker:
    """Rules across lines: arrivals non-decreasing (unless sorting is left to
    the caller) and ids unique."""

    def __init__(self, *, check_order: bool = True) -> None:
        self._check_order = check_order
        self._last_arrival_s = -math.inf
        self._last_line = 0
        self._id_lines: dict[str, int] = {}

    def feed(self, request: TraceRequest, line: int) -> None:
        if self._check_order and request.arrival_s < self._last_arrival_s:
            raise TraceError(
                line,
                "arrival_s",
                f"arrivals must be non-decreasing: {request.arrival_s!r} < "
                f"{self._last_arrival_s!r} on line {self._last_line} (sort the trace first)",
            )
        self._last_arrival_s = max(self._last_arrival_s, request.arrival_s)
        self._last_line = line
        if request.id is not None:
            first = self._id_lines.setdefault(request.id, line)
            if first != line:
                raise TraceError(
                    line, "id", f"duplicate id {show_value(request.id)} (first on line {first})"
                )
