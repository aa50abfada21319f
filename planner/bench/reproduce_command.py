"""The options of the command that reproduces a bench's run: each value as
the option takes it, and only the options whose values are not their
defaults."""

from __future__ import annotations


def option_text(value: object) -> str:
    """A value as an option takes it: floats without trailing zeros, every
    other value (integers included, however large) as str writes it."""
    return f"{value:g}" if isinstance(value, float) else str(value)


def changed_options(*options: tuple[str, object, object]) -> list[str]:
    """FLAG VALUE for each (flag, value, default) whose value is not the
    default."""
    parts = []
    for flag, value, default in options:
        if value != default:
            parts += [flag, option_text(value)]
    return parts
