"""--config FILE.yaml: the file's options, the command line over them, and a
bad file named by file, line and key (exit 2, no traceback)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from planner.cli import main
from planner.commands import replay
from planner.commands.knobs import SETTINGS, knob_table
from planner.trace.io import write_trace
from planner.trace.records import TraceRequest


@pytest.fixture
def trace(tmp_path: Path) -> Path:
    path = tmp_path / "tiny.jsonl"
    write_trace(path, [TraceRequest(0.05 * i, 150 + 20 * i, 4 + i % 3) for i in range(8)])
    return path


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    try:
        code = main(list(args))
    except SystemExit as exc:  # argparse's own exit
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


def replay_json(capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, object]:
    code, out, err = run(capsys, "replay", *args, "--quiet", "--json-out", "-")
    assert code == 0, err
    data: dict[str, object] = json.loads(out)
    return data


def test_the_file_sets_knobs_and_policies_and_the_command_line_wins(
    capsys: pytest.CaptureFixture[str], trace: Path, tmp_path: Path
) -> None:
    config = tmp_path / "replay.yaml"
    config.write_text("policy: [fcfs, lvf]\nslo_ttft: 0.25\nalpha: 2.5\n", encoding="utf-8")
    data = replay_json(capsys, str(trace), "--config", str(config))
    assert [p["policy"] for p in data["policies"]] == ["fcfs", "lvf"]  # type: ignore[index]
    assert {p["config"]["slo_ttft_s"] for p in data["policies"]} == {0.25}  # type: ignore[index]
    assert {p["config"]["alpha"] for p in data["policies"]} == {2.5}  # type: ignore[index]
    data = replay_json(
        capsys, str(trace), "--config", str(config), "--slo-ttft", "3", "--policy", "lvf"
    )
    assert [p["policy"] for p in data["policies"]] == ["lvf"]  # type: ignore[index]
    assert data["policies"][0]["config"]["slo_ttft_s"] == 3.0  # type: ignore[index]
    assert data["policies"][0]["config"]["alpha"] == 2.5  # type: ignore[index]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "slo_ttft: 2\nalpah: 3\n",
            "cfg.yaml:2: alpah: unknown key (known: admission_queue, alpha,",
        ),
        ("alpha: fast\n", "cfg.yaml:1: alpha: must be a number, got 'fast'"),
        ("\nmax_running: 2.5\n", "cfg.yaml:2: max_running: must be an integer, got 2.5"),
        ("topology: moon\n", "cfg.yaml:1: topology: 'moon' is not one of rotation,"),
        ("quiet: 1\n", "cfg.yaml:1: quiet: must be true or false, got 1"),
        ("slo_ttft: 1\nslo_ttft: 2\n", "cfg.yaml:2: slo_ttft: written twice (first at"),
        ("alpha: [1\n", "cfg.yaml:2: invalid YAML"),
        ("- alpha\n", "cfg.yaml:1: must be a mapping of key: value"),
    ],
)
def test_a_bad_file_is_named_with_its_line_and_key(
    capsys: pytest.CaptureFixture[str], trace: Path, tmp_path: Path, text: str, expected: str
) -> None:
    config = tmp_path / "cfg.yaml"
    config.write_text(text, encoding="utf-8")
    code, _, err = run(capsys, "replay", str(trace), "--config", str(config))
    assert code == 2
    assert f"--config {tmp_path}/{expected}" in err
    assert "Traceback" not in err


def test_a_value_the_command_refuses_is_named_with_its_line(
    capsys: pytest.CaptureFixture[str], trace: Path, tmp_path: Path
) -> None:
    config = tmp_path / "cfg.yaml"
    config.write_text("policy: [fcfs]\n\nslo_ttft: -1\n", encoding="utf-8")
    code, _, err = run(capsys, "replay", str(trace), "--config", str(config), "--quiet")
    assert code == 2
    assert err.strip() == (
        f"planner replay: {config}:3: slo_ttft: --slo-ttft must be a finite number > 0, got -1.0"
    )
    # The same refusal from the command line names only the option.
    code, _, err = run(capsys, "replay", str(trace), "--slo-ttft", "-1", "--quiet")
    assert err.strip() == "planner replay: --slo-ttft must be a finite number > 0, got -1.0"


def test_a_missing_file_is_named(
    capsys: pytest.CaptureFixture[str], trace: Path, tmp_path: Path
) -> None:
    code, _, err = run(capsys, "replay", str(trace), "--config", str(tmp_path / "no.yaml"))
    assert code == 2
    assert f"--config {tmp_path}/no.yaml: cannot read: No such file or directory" in err


def test_serve_reads_a_config_file_and_names_its_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    config = tmp_path / "serve.yaml"
    config.write_text("port: 0\nstore: ':memory:'\nmax_workers: 0\n", encoding="utf-8")
    code, _, err = run(capsys, "serve", "--config", str(config))
    assert code == 2
    assert err.strip() == f"planner serve: {config}:3: max_workers: --max-workers must be > 0"
    config.write_text("port: 0\nlog_level: loud\n", encoding="utf-8")
    code, _, err = run(capsys, "serve", "--config", str(config))
    assert code == 2
    assert f"{config}:2: log_level: 'loud' is not one of debug, info, warning, error" in err


def test_every_knob_is_an_option_of_replay_with_its_dataclass_default() -> None:
    parser = argparse.ArgumentParser()
    replay.register(parser.add_subparsers())
    args = parser.parse_args(["replay", "t.jsonl"])
    table = knob_table()
    assert len(table) == sum(len(cls.__dataclass_fields__) for cls in SETTINGS)
    for name, knob in table.items():
        assert getattr(args, name) == knob.default, name
