"""Every replay feature on every topology: `--report-dir` writes each
topology's PNGs and names them, `--compute-jitter` is deterministic for a
seed (rotation, long-context, cluster), `--json-out` and `--requests-out`
record every run, each run drives a progress bar, and each topology's table
opens with goodput."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from replay_cli import replay, write_trace

from planner.commands import replay as replay_command

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"

ROWS: list[dict[str, Any]] = [
    {
        "arrival_s": 0.05 * i,
        "prompt_tokens": 300 + 40 * i,
        "output_tokens": 20 + 3 * i,
        "id": f"r{i}",
        "model": f"m{i % 2}",
    }
    for i in range(16)
]
LONG_ROWS: list[dict[str, Any]] = [
    {"arrival_s": 0.0, "prompt_tokens": 9000, "output_tokens": 12, "id": "a"},
    {"arrival_s": 0.1, "prompt_tokens": 16000, "output_tokens": 8, "id": "b"},
    {"arrival_s": 0.2, "prompt_tokens": 12000, "output_tokens": 20, "id": "c"},
    {"arrival_s": 0.3, "prompt_tokens": 30000, "output_tokens": 6, "id": "d"},
]
SHARED = ("attainment_vs_load.png", "tbt_cdf.png", "ttft_cdf.png")
# Per topology: its arguments, its trace's rows and the plots it writes with
# a two-point rate sweep.
TOPOLOGIES: dict[str, tuple[tuple[str, ...], list[dict[str, Any]], tuple[str, ...]]] = {
    "rotation": ((), ROWS, (*SHARED, "kv_occupancy.png", "queue_length.png")),
    "long-context": (
        ("--gpu-kv-gb", "3", "--policy", "orbitflow", "--policy", "deepspeed"),
        LONG_ROWS,
        (*SHARED, "kv_occupancy.png", "kv_stall.png", "queue_length.png"),
    ),
    "cluster": (("--instances", "2"), ROWS, (*SHARED, "kv_occupancy.png", "queue_length.png")),
    "serverless": (
        ("--policy", "c2cserve", "--policy", "sllm"),
        ROWS,
        (
            *SHARED,
            "kv_occupancy.png",
            "queue_length.png",
            "slices.png",
            "link_load.png",
            "cold_start_vs_load.png",
        ),
    ),
}


@pytest.mark.parametrize("topology", list(TOPOLOGIES))
def test_report_dir_writes_every_plot_and_names_it(
    topology: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args, rows, expected = TOPOLOGIES[topology]
    trace = write_trace(tmp_path / "t.jsonl", rows)
    plots = tmp_path / "plots"
    code, out, err = replay(
        capsys,
        str(trace),
        "--topology",
        topology,
        *args,
        "--rate-scale",
        "1",
        "--rate-scale",
        "2",
        "--quiet",
        "--report-dir",
        str(plots),
    )
    assert code == 0, err
    written = sorted(p.name for p in plots.iterdir())
    assert written == sorted(expected)
    for name in written:
        data = (plots / name).read_bytes()
        assert data.startswith(PNG_MAGIC) and len(data) > 1000
    line = next(x for x in out.splitlines() if x.startswith("wrote ") and "plots" in x)
    assert line.startswith(f"wrote {len(expected)} plots to {plots}: ")
    assert sorted(line.split(": ", 1)[1].split(", ")) == written


@pytest.mark.parametrize("topology", ["rotation", "long-context", "cluster", "serverless"])
def test_the_table_opens_with_goodput(
    topology: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("COLUMNS", "200")
    args, rows, _ = TOPOLOGIES[topology]
    trace = write_trace(tmp_path / "t.jsonl", rows)
    code, out, err = replay(capsys, str(trace), "--topology", topology, *args, "--quiet")
    assert code == 0, err
    labels = [
        cells[1].strip()
        for line in out.splitlines()
        if line.startswith("│") and (cells := line.split("│"))[1].strip()
    ]
    assert labels[0] in ("Goodput", "TTFT and TPOT met"), labels[:3]
    assert "TTFT and TPOT met" in labels[:2]


JITTER_TOPOLOGIES = tuple(TOPOLOGIES)


def requests_under_jitter(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], topology: str, name: str, *jitter: str
) -> str:
    args, rows, _ = TOPOLOGIES[topology]
    trace = write_trace(tmp_path / f"{topology}.jsonl", rows)
    out_csv = tmp_path / f"{topology}-{name}.csv"
    out_json = tmp_path / f"{topology}-{name}.json"
    code, _, err = replay(
        capsys,
        str(trace),
        "--topology",
        topology,
        *args,
        "--rate-scale",
        "4",
        "--quiet",
        *jitter,
        "--requests-out",
        str(out_csv),
        "--json-out",
        str(out_json),
    )
    assert code == 0, err
    data = json.loads(out_json.read_text())
    cv = float(jitter[1]) if jitter else 0.0
    seed = int(jitter[3]) if len(jitter) > 2 else 0
    for p in data["policies"]:
        assert p["config"]["compute_jitter_cv"] == cv and p["config"]["seed"] == seed
    return out_csv.read_text()


@pytest.mark.parametrize("topology", JITTER_TOPOLOGIES)
def test_jitter_is_deterministic_for_a_seed_on_each_topology(
    topology: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    plain = requests_under_jitter(tmp_path, capsys, topology, "plain")
    zero = requests_under_jitter(
        tmp_path, capsys, topology, "zero", "--compute-jitter", "0", "--seed", "5"
    )
    assert zero == plain
    jitter = ("--compute-jitter", "0.3", "--seed")
    seed1 = requests_under_jitter(tmp_path, capsys, topology, "s1", *jitter, "1")
    again = requests_under_jitter(tmp_path, capsys, topology, "s1b", *jitter, "1")
    seed2 = requests_under_jitter(tmp_path, capsys, topology, "s2", *jitter, "2")
    assert seed1 == again
    assert seed1 != plain and seed2 != seed1


@pytest.mark.parametrize("topology", list(TOPOLOGIES))
def test_every_run_drives_a_progress_bar_to_its_last_arrival(
    topology: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each policy run opens one bar, and its engine reports its simulated
    clock to it up to the last arrival at least."""
    opened: list[tuple[str, float | None, list[float]]] = []
    real = replay_command.replay_progress

    @contextlib.contextmanager
    def recording(
        description: str, total_simulated_s: float | None = None, **kwargs: Any
    ) -> Iterator[Any]:
        times: list[float] = []
        opened.append((description, total_simulated_s, times))
        with real(description, total_simulated_s, **kwargs) as bar:

            class Recorder:
                def update(self, now_s: float, **counts: Any) -> None:
                    times.append(now_s)
                    bar.update(now_s, **counts)

            yield Recorder()

    monkeypatch.setattr(replay_command, "replay_progress", recording)
    args, rows, _ = TOPOLOGIES[topology]
    trace = write_trace(tmp_path / "t.jsonl", rows)
    code, _, err = replay(capsys, str(trace), "--topology", topology, *args)
    assert code == 0, err
    policies = [a for i, a in enumerate(args) if i and args[i - 1] == "--policy"]
    expected = policies or list(replay_command.DEFAULT_POLICIES[topology])
    assert [d for d, _, _ in opened] == [f"{p} x1" for p in expected]
    last_arrival = max(r["arrival_s"] for r in rows)
    for description, total, times in opened:
        assert total == pytest.approx(last_arrival), description
        assert times and max(times) >= last_arrival, description


@pytest.mark.parametrize("topology", list(TOPOLOGIES))
def test_json_on_standard_output_with_the_table_on_standard_error(
    topology: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args, rows, _ = TOPOLOGIES[topology]
    trace = write_trace(tmp_path / "t.jsonl", rows)
    code, out, err = replay(
        capsys, str(trace), "--topology", topology, *args, "--quiet", "--json-out", "-"
    )
    assert code == 0, err
    policies = [a for i, a in enumerate(args) if i and args[i - 1] == "--policy"]
    expected = policies or list(replay_command.DEFAULT_POLICIES[topology])
    data = json.loads(out)
    assert [p["policy"] for p in data["policies"]] == expected
    assert all(p["config"]["policy"] == p["policy"] for p in data["policies"])
    assert "TTFT and TPOT met" in err
