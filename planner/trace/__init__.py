"""Request traces: the JSON-lines format, converters from public formats, a
synthetic generator and statistics (DESIGN.md §4).

Modules: records (TraceRequest), validate (the rules of a record), io
(load_trace / write_trace), errors, atomic (all-or-nothing writes),
arrivals (rate schedules, Poisson/Gamma renewal arrivals), lengths and
presets (length distributions, fitted presets), length_model and
lengths_file (where length pairs come from), generate (synthetic traces),
stamp (fields set on every request), stats and stats_table (statistics),
importers/ (one converter per public format, and the import pipeline).
"""

from planner.trace.errors import TraceError
from planner.trace.io import load_trace, write_trace
from planner.trace.records import TraceRequest

__all__ = ["TraceError", "TraceRequest", "load_trace", "write_trace"]
