"""The GPU benchmark script in its tiny smoke mode, on whatever device is here."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")

from planner.kernels.triton_support import interpreting  # noqa: E402

from planner.bench import kernels_gpu  # noqa: E402
from planner.profiles.loading import load_profile  # noqa: E402


def test_smoke_run_writes_report_and_a_loadable_profile(tmp_path, capsys):
    assert kernels_gpu.main(["--smoke", "--out", str(tmp_path)]) == 0
    report = json.loads((tmp_path / "kernels.json").read_text())
    assert report["smoke"] is True
    assert report["checks"] and set(report["checks"].values()) == {"ok"}
    methods = report["table1"]["methods"]
    assert {"naive_per_segment", "ms_per_block"} <= set(methods)
    assert any(k.startswith("duplex_") for k in methods)
    if interpreting() or torch.cuda.is_available():
        assert {row["rho"] for row in report["hybrid_gemm"]} == {0.0, 0.5, 1.0}
    assert all(row["max_abs_err"] < 0.1 for row in report["hybrid_gemm"])
    profile = load_profile(tmp_path / "profile.json")
    assert profile.hardware.h2d_gbps > 0
    assert "checks_failed" in capsys.readouterr().out


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU refusal")
def test_full_mode_refuses_without_a_gpu(tmp_path):
    assert kernels_gpu.main(["--out", str(tmp_path)]) == 2
    assert not (tmp_path / "kernels.json").exists()
