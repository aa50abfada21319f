"""What a backend hands back to `solve`, before objective, gap and time are added."""

from __future__ import annotations

from dataclasses import dataclass

from .frozen import FloatArray
from .result import Status


@dataclass(frozen=True)
class Outcome:
    status: Status
    values: FloatArray | None = None
    best_bound: float | None = None
    """In the model's units and sense; None when unknown."""
    note: str = ""
