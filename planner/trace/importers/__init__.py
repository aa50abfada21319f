"""Converters from public trace formats to our JSON lines (one module per
format; the registry maps --format names to them)."""

from __future__ import annotations

from planner.trace.importers import alibaba, azure, burstgpt, mooncake, sharegpt, vidur
from planner.trace.importers.base import Converter, ImportOptions, ImportSummary

CONVERTERS: dict[str, Converter] = {
    c.name: c
    for c in (
        azure.CONVERTER,
        mooncake.CONVERTER,
        burstgpt.CONVERTER,
        sharegpt.CONVERTER,
        alibaba.CONVERTER,
        vidur.CONVERTER,
    )
}

__all__ = ["CONVERTERS", "Converter", "ImportOptions", "ImportSummary"]
