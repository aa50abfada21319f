"""The GPU profiles measured by planner.bench.kernels_gpu on the lent H100 and
H200 machines: they load, say where they come from, and their link curves
are what the copy engine delivered (PCIe Gen5 x16 at about 55 GB/s one way,
less with both directions busy)."""

from __future__ import annotations

from pathlib import Path

import pytest

from planner.bench.rotation_quality import on_machine
from planner.profiles import load_profile

PROFILES = Path(__file__).resolve().parents[2] / "fixtures" / "profiles"
MEASURED = {
    "h100-measured.json": "NVIDIA H100 80GB HBM3",
    "h200-measured.json": "NVIDIA H200",
}


@pytest.mark.parametrize(("file", "device"), sorted(MEASURED.items()))
def test_a_measured_profile_names_its_card_and_tool(file, device):
    p = load_profile(PROFILES / file)
    assert p.provenance["kind"] == "measured"
    assert p.provenance["device"] == device
    assert "kernels_gpu" in p.provenance["tool"]
    assert "smoke" not in p.name
    link = p.hardware.link_model()
    big = 256 * 1024**2
    for direction in ("h2d", "d2h"):
        assert 45.0 <= link.gbps(big, direction) <= 64.0
        assert link.gbps(16 * 1024, direction) < link.gbps(big, direction)
    h2d, d2h = link.concurrent_gbps(big, big)
    assert h2d + d2h > link.gbps(big, "h2d")  # the link is full duplex


def test_every_profile_file_loads():
    files = sorted(PROFILES.glob("*.json"))
    assert {f.name for f in files} >= set(MEASURED)
    for f in files:
        load_profile(f)


def test_rows_move_to_a_measured_machine_keeping_their_model():
    machine = PROFILES / "h100-measured.json"
    assert on_machine("llama-3-8b@h100-sxm-80gb", machine) == f"llama-3-8b@{machine}"
