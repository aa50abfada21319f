"""`planner profiles list|show`."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from planner_cli import run_planner

from planner.profiles import HARDWARE_PROFILES, MODEL_PROFILES, IterationCostModel
from planner.profiles.loading import profile_from_dict

REPO_ROOT = Path(__file__).resolve().parents[2]
FIXTURE = REPO_ROOT / "fixtures" / "profiles" / "gh200-144gb.handwritten.json"
PLANNER = Path(sys.executable).parent / "planner"


def run(capsys, *argv: str) -> tuple[int, str, str]:
    return run_planner(capsys, "profiles", *argv)


def test_list_shows_every_profile(capsys):
    code, out, _ = run(capsys, "list")
    assert code == 0
    for name in [*MODEL_PROFILES, *HARDWARE_PROFILES]:
        assert name in out
    assert "NVLink-C2C" in out and "PCIe Gen5 x16" in out
    assert "192+192" in out  # GH200 both busy
    assert "top-2 of 8" in out  # Mixtral


def test_list_json(capsys):
    code, out, _ = run(capsys, "list", "--json")
    assert code == 0
    doc = json.loads(out)
    assert [m["name"] for m in doc["models"]] == sorted(MODEL_PROFILES)
    assert [h["name"] for h in doc["hardware"]] == sorted(HARDWARE_PROFILES)
    llama = next(m for m in doc["models"] if m["name"] == "llama-3-8b")
    assert llama["kv_bytes_per_token"] == 131_072 and llama["param_count"] == 8_030_261_248


def test_show_model(capsys):
    code, out, _ = run(capsys, "show", "qwen2.5-32b")
    assert code == 0
    assert "262,144" in out  # KV bytes per token
    assert "65,536" in out  # one layer's segment of a 16-token block
    assert "gh200-144gb" in out  # the per-hardware cost table


def test_show_hardware_text_and_json(capsys):
    code, out, _ = run(capsys, "show", "gh200-144gb")
    assert code == 0
    assert "sum <= 384" in out and "192.0" in out
    code, out, _ = run(capsys, "show", "gh200-144gb", "--json")
    assert code == 0
    # The JSON is a loadable profile document.
    assert profile_from_dict(json.loads(out)).hardware == HARDWARE_PROFILES["gh200-144gb"]


def test_show_cost_model(capsys):
    code, out, _ = run(capsys, "show", "llama-3-8b@h100-sxm-80gb")
    assert code == 0
    assert "5.601 ms" in out  # weights floor
    assert "23.339 µs" in out  # per token
    assert "26,674 blocks" in out
    code, out, _ = run(capsys, "show", "llama-3-8b@h100", "--json")
    assert code == 0
    doc = json.loads(out)
    derived = IterationCostModel.derive(
        MODEL_PROFILES["llama-3-8b"], HARDWARE_PROFILES["h100-sxm-80gb"]
    )
    assert doc["constants"] == derived.constants.as_dict()
    assert doc["kv_capacity"]["gpu_blocks"] == 26_674


def test_show_cost_model_options(capsys):
    code, out, _ = run(
        capsys, "show", "llama-3-70b@h100-sxm-80gb", "--tp", "4", "--block-size", "32", "--json"
    )
    assert code == 0
    doc = json.loads(out)
    assert doc["tensor_parallel"] == 4 and doc["kv_capacity"]["block_size_tokens"] == 32
    code, _, err = run(capsys, "show", "llama-3-8b@h100-sxm-80gb", "--tp", "3")
    assert code == 2
    assert err.startswith("planner profiles: tensor_parallel:")


def test_show_file_and_model_on_file(capsys):
    code, out, _ = run(capsys, "show", str(FIXTURE))
    assert code == 0
    assert "hand-written" in out and "179.37" in out and "overhead_s" in out
    code, out, _ = run(capsys, "show", f"qwen2.5-32b@{FIXTURE}", "--json")
    assert code == 0
    doc = json.loads(out)
    assert doc["measured_constants"] == ["overhead_s"]
    assert doc["constants"]["overhead_s"] == 0.0007


@pytest.mark.parametrize(
    ("arg", "expect"),
    [
        ("nope", ["llama-3-8b", "gh200-144gb", "MODEL@HARDWARE"]),
        ("nope@h100-sxm-80gb", ["unknown model 'nope'", "qwen2.5-32b"]),
        ("llama-3-8b@nope", ["unknown hardware 'nope'", "a100-sxm-80gb"]),
        ("missing.json", ["no such profile file"]),
    ],
)
def test_bad_names_exit_2_with_one_line(capsys, arg, expect):
    code, out, err = run(capsys, "show", arg)
    assert code == 2
    assert out == ""
    assert err.count("\n") == 1 and err.startswith("planner profiles: ")
    for text in expect:
        assert text in err


def test_invalid_file_names_the_field(capsys, tmp_path):
    doc = json.loads(FIXTURE.read_text())
    doc["hardware"]["hbm_bytes"] = -5
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(doc))
    code, _, err = run(capsys, "show", str(bad))
    assert code == 2
    assert f"{bad}: hardware.hbm_bytes: must be >= 1" in err


def test_subprocess_exit_codes():
    ok = subprocess.run(
        [str(PLANNER), "profiles", "list"], check=False, capture_output=True, text=True, timeout=60
    )
    assert ok.returncode == 0 and "llama-3-8b" in ok.stdout
    bad = subprocess.run(
        [str(PLANNER), "profiles", "show", "nope"],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad.returncode == 2
    assert bad.stderr.strip().startswith("planner profiles: unknown profile 'nope'")
