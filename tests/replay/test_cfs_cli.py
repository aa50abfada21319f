"""`planner replay --policy cfs --policy cfs-peer` as a user runs it: the two
paging targets side by side on the same arrivals, what each pages into and
over, and bad CFS flags as exit 2 with one line naming the flag."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from replay_cli import replay, write_trace

from planner.cli import main

PROFILES = Path(__file__).resolve().parents[2] / "fixtures" / "profiles"

# Twelve prompts within 12 ms.
BURST = [
    {"arrival_s": 0.001 * i, "prompt_tokens": 700 + 50 * i, "output_tokens": 40, "id": f"b{i}"}
    for i in range(12)
]


@pytest.fixture
def trace(tmp_path: Path) -> Path:
    return write_trace(tmp_path / "burst.jsonl", BURST)


def test_dram_and_peer_paging_side_by_side(
    trace: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out_json = tmp_path / "out.json"
    code, out, err = replay(
        capsys,
        str(trace),
        "--policy=fcfs",
        "--policy=cfs",
        "--policy=cfs-peer",
        "--quiet",
        "--cpu-kv-gb=2",
        "--peer-kv-gb=1",
        "--cfs-every=2",
        "--dram-copy-kib=32",
        f"--json-out={out_json}",
        "--profile=llama-3-8b@h100-sxm-80gb",
    )
    assert code == 0, err
    assert "cfs-peer" in out
    data = json.loads(out_json.read_text(encoding="utf-8"))
    runs = {run["policy"]: run for run in data["policies"]}
    assert set(runs) == {"fcfs", "cfs", "cfs-peer"}
    block_bytes = runs["cfs"]["config"]["block_bytes"]
    assert runs["cfs"]["config"]["cpu_kv_blocks"] == int(2e9) // block_bytes
    assert runs["cfs"]["config"]["paging_link"] == "PCIe Gen5 x16, 32,768-byte copies"
    assert runs["cfs-peer"]["config"]["cpu_kv_blocks"] == int(1e9) // block_bytes
    assert runs["cfs-peer"]["config"]["paging_link"].startswith("NVLink peer")
    assert "paging_link" not in runs["fcfs"]["config"]
    for run in runs.values():
        metrics = run["metrics"]
        assert (metrics["finished"], metrics["output_tokens"]) == (12, 12 * 40)


def test_help_lists_the_cfs_policies_and_flags(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["replay", "--help"])
    assert exc.value.code == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "cfs, cfs-peer" in out
    assert "--peer-kv-gb" in out and "--cfs-every K" in out and "--dram-copy-kib" in out
    assert "over NVLink" in out


@pytest.mark.parametrize(
    ("flag", "message"),
    [
        ("--peer-kv-gb=-1", "--peer-kv-gb must be a finite number >= 0, got -1.0"),
        ("--peer-kv-gb=nan", "--peer-kv-gb must be a finite number >= 0, got nan"),
        ("--cfs-every=0", "--cfs-every must be >= 1, got 0"),
        ("--dram-copy-kib=0", "--dram-copy-kib must be a finite number > 0, got 0.0"),
        ("--dram-copy-kib=inf", "--dram-copy-kib must be a finite number > 0, got inf"),
    ],
)
def test_bad_cfs_flags_exit_2_naming_the_flag(
    trace: Path, capsys: pytest.CaptureFixture[str], flag: str, message: str
) -> None:
    code, _, err = replay(capsys, str(trace), "--policy=cfs", flag, "--quiet")
    assert code == 2
    assert err.strip() == f"planner replay: {message}"
    assert "Traceback" not in err


def test_peer_paging_needs_nvlink_in_the_profile(
    trace: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The bundled measured profile with its NVLink bandwidth taken out.
    profile = json.loads((PROFILES / "gh200-144gb.handwritten.json").read_text("utf-8"))
    del profile["hardware"]["nvlink_gbps"]
    path = tmp_path / "no-nvlink.json"
    path.write_text(json.dumps(profile), encoding="utf-8")
    code, _, err = replay(
        capsys, str(trace), "--policy=cfs-peer", "--quiet", f"--profile=qwen2.5-32b@{path}"
    )
    assert code == 2
    assert err.strip() == "planner replay: --policy cfs-peer: gh200-144gb has no NVLink bandwidth"
    # The DRAM variant needs none.
    code, _, err = replay(
        capsys, str(trace), "--policy=cfs", "--quiet", f"--profile=qwen2.5-32b@{path}"
    )
    assert code == 0, err
