"""Shared helpers of the trace tests: the public traces in ../shared/traces
(read in place, never copied; a test skips when its file is absent) and a
writer of small hand-made files."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
SHARED_TRACES = REPO_ROOT.parent / "shared" / "traces"

SharedTrace = Callable[[str], Path]
WriteFile = Callable[[str, str], Path]


@pytest.fixture
def shared_trace() -> SharedTrace:
    """shared_trace("AzureLLMInferenceTrace_conv.csv") → its path, or a skip."""

    def find(name: str) -> Path:
        path = SHARED_TRACES / name
        if not path.is_file():
            pytest.skip(f"public trace {name} not found in {SHARED_TRACES}")
        return path

    return find


@pytest.fixture
def write_file(tmp_path: Path) -> WriteFile:
    """write_file("a.csv", text) → tmp_path / "a.csv" holding text, as is."""

    def write(name: str, text: str) -> Path:
        path = tmp_path / name
        path.write_text(text, encoding="utf-8", newline="")
        return path

    return write
