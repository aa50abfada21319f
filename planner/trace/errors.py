"""Errors of the trace tools: a bad line of a file, a bad option value."""

from __future__ import annotations

import json
from pathlib import Path

_GOT_MAX_CHARS = 60


class TraceError(Exception):
    """A bad line (or a bad file) of a trace or of a source being imported.

    str() is one line a user can act on, e.g.
    ``trace.jsonl:17: prompt_tokens: must be an integer >= 1, got -3``.
    `line` is 1-based (None when the problem is the file as a whole), `field`
    the field or column at fault (None when the line as a whole is bad).
    """

    def __init__(
        self,
        line: int | None,
        field: str | None,
        reason: str,
        *,
        path: str | Path | None = None,
    ) -> None:
        self.line = line
        self.field = field
        self.reason = reason
        self.path = None if path is None else str(path)
        super().__init__(self._message())

    def _message(self) -> str:
        where = self.path if self.path is not None else "trace"
        if self.line is not None:
            where = f"{where}:{self.line}"
        if self.field is not None:
            return f"{where}: {self.field}: {self.reason}"
        return f"{where}: {self.reason}"

    def with_path(self, path: str | Path) -> TraceError:
        """The same error, naming `path` as the file."""
        return TraceError(self.line, self.field, self.reason, path=path)


class SpecError(ValueError):
    """A bad option value: a rate schedule, a length distribution, a window.

    `option` names the command-line option (e.g. ``--rate-schedule``)."""

    def __init__(self, option: str, reason: str) -> None:
        self.option = option
        self.reason = reason
        super().__init__(f"{option}: {reason}")


def show_value(value: object) -> str:
    """A JSON-ish rendering of a bad value for an error message: -3, 1.5,
    true, "12", null; long values are cut."""
    try:
        text = json.dumps(value, allow_nan=True)
    except (TypeError, ValueError):
        text = repr(value)
    if len(text) > _GOT_MAX_CHARS:
        text = text[: _GOT_MAX_CHARS - 3] + "..."
    return text
