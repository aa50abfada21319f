"""docs/benchmarks.md: one section per bench between its markers.

A bench rewrites only its own section, `<!-- bench:NAME -->` ...
`<!-- /bench:NAME -->`, so sections of other benches (solvers, service,
replay) stay as they are. A missing file gets the page header; a missing
section is appended.
"""

from __future__ import annotations

from pathlib import Path

PAGE_HEADER = """# Benchmarks

Speed targets live here, in benchmarks, not in timed unit tests (DESIGN.md §7).
Each section below is (re)written by the command it names, which also writes
raw results with the machine's description as JSON under `docs/bench/`.
A bench rewrites only its own section, between its `<!-- bench:NAME -->` and
`<!-- /bench:NAME -->` markers. Compare a new run with an old one with
`--baseline OLD.json` (a case regresses when its median grows by more than
the noise factor, 1.2x by default).
"""


def begin_marker(name: str) -> str:
    return f"<!-- bench:{name} -->"


def end_marker(name: str) -> str:
    return f"<!-- /bench:{name} -->"


def replace_section(text: str, name: str, body: str) -> str:
    """text with the section `name` set to body (markers included)."""
    begin, end = begin_marker(name), end_marker(name)
    section = f"{begin}\n{body.strip()}\n{end}"
    start = text.find(begin)
    if start < 0:
        head = text.rstrip() if text.strip() else PAGE_HEADER.rstrip()
        return f"{head}\n\n{section}\n"
    stop = text.find(end, start)
    if stop < 0:
        raise ValueError(f"{begin} has no closing {end}")
    return text[:start] + section + text[stop + len(end) :]


def write_section(path: Path, name: str, body: str) -> None:
    text = path.read_text(encoding="utf-8") if path.exists() else ""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(replace_section(text, name, body), encoding="utf-8")
