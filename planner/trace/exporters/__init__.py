"""Exporters from our JSON lines to other tools' trace formats (one module
per format; the registry maps --format names to them)."""

from __future__ import annotations

from planner.trace.exporters import vidur, vllm_burstgpt
from planner.trace.exporters.base import Exporter, ExportSummary, export_trace

EXPORTERS: dict[str, Exporter] = {e.name: e for e in (vidur.EXPORTER, vllm_burstgpt.EXPORTER)}

__all__ = ["EXPORTERS", "ExportSummary", "Exporter", "export_trace"]
