"""`planner bench kernels` in its smoke mode (here, under tests/kernels, so
that its conftest sets up the Triton interpreter before anything imports
triton): the GPU benchmark's code path,
run at tiny sizes on whatever device is here, writes its report and a
profile replay can load."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from planner.cli import main


def test_smoke_writes_report_and_profile(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["bench", "kernels", "--smoke", "--skip-gemm", "--out", str(tmp_path)]) == 0
    capsys.readouterr()
    report = json.loads((tmp_path / "kernels.json").read_text())
    assert report["smoke"] is True
    assert all(v == "ok" for v in report["checks"].values()), report["checks"]
    assert (tmp_path / "profile.json").exists()
