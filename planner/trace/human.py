"""Numbers for people: durations with a unit that fits."""

from __future__ import annotations


def format_duration(seconds: float) -> str:
    """1.5 → "1.500 s", 3501.7 → "3501.7 s (58.4 min)", 2e6 → "...(23.0 days)"."""
    if seconds >= 2 * 86400:
        return f"{seconds:.1f} s ({seconds / 86400:.1f} days)"
    if seconds >= 3600:
        return f"{seconds:.1f} s ({seconds / 3600:.2f} h)"
    if seconds >= 60:
        return f"{seconds:.1f} s ({seconds / 60:.1f} min)"
    return f"{seconds:.3f} s"
