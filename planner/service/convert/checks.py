"""Field checks that raise InvalidArgumentError naming the field."""

from __future__ import annotations

import math

from planner.service.errors import InvalidArgumentError
from planner.service.limits import MAX_BLOCKS


def finite(field: str, value: float) -> float:
    if not math.isfinite(value):
        raise InvalidArgumentError(field, f"must be a finite number, got {value}")
    return value


def positive(field: str, value: float) -> float:
    finite(field, value)
    if value <= 0:
        raise InvalidArgumentError(field, f"must be > 0, got {value}")
    return value


def at_most(field: str, value: float, high: float, unit: str = "") -> float:
    if value > high:
        raise InvalidArgumentError(field, f"must be <= {high}{unit}, got {value}")
    return value


def non_negative(field: str, value: float) -> float:
    finite(field, value)
    if value < 0:
        raise InvalidArgumentError(field, f"must be >= 0, got {value}")
    return value


def block_count(field: str, value: int) -> int:
    if value < 0:
        raise InvalidArgumentError(field, f"must be >= 0, got {value}")
    if value > MAX_BLOCKS:
        raise InvalidArgumentError(field, f"must be <= {MAX_BLOCKS}, got {value}")
    return value


def block_ids(field: str, ids: tuple[int, ...], allow_none: bool = False) -> tuple[int, ...]:
    """Block ids are >= 0 (-1 marks "no copy" where allow_none) and < MAX_BLOCKS."""
    if not ids:
        return ids
    low = -1 if allow_none else 0
    if min(ids) < low or max(ids) >= MAX_BLOCKS:
        for i, b in enumerate(ids):
            if b < low or b >= MAX_BLOCKS:
                allowed = "-1 or a block id" if allow_none else "a block id"
                raise InvalidArgumentError(
                    f"{field}[{i}]", f"must be {allowed} in [0, {MAX_BLOCKS}), got {b}"
                )
    return ids
