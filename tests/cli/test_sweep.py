"""planner sweep: the grid a file expands to, its table, resuming, bad files
named by line, and the same rows from one process, worker processes and a
real local Ray instance."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pandas as pd
import pytest

from planner.api import sweep
from planner.cli import main
from planner.commands.config_file import ConfigError
from planner.commands.replay import DEFAULT_POLICIES
from planner.commands.sweep import OVER_TIME_LIMIT, clock_limited_rows
from planner.commands.sweep_run import LEADING_METRICS, WALL_S
from planner.commands.sweep_spec import read_spec, spec_from_mapping
from planner.trace.io import write_trace
from planner.trace.records import TraceRequest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def traces(tmp_path: Path) -> tuple[Path, Path]:
    a = tmp_path / "a.jsonl"
    b = tmp_path / "b.jsonl"
    write_trace(a, [TraceRequest(0.04 * i, 300 + 40 * i, 5 + i % 4) for i in range(10)])
    write_trace(b, [TraceRequest(0.02 * i, 900, 12) for i in range(10)])
    return a, b


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    try:
        code = main(list(args))
    except SystemExit as exc:
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


def test_the_grid_is_every_combination_in_the_files_order(traces: tuple[Path, Path]) -> None:
    a, b = traces
    spec = spec_from_mapping(
        {
            "slo_ttft": 2.0,
            "grid": {"trace": [str(a), str(b)], "policy": ["fcfs", "lvf"], "alpha": [1, 3.5]},
        }
    )
    got = [(c.trace, c.policy, dict(c.knobs)) for c in spec.configurations]
    assert got == [
        (trace, policy, {"slo_ttft": 2.0, "alpha": alpha})
        for trace in (str(a), str(b))
        for policy in ("fcfs", "lvf")
        for alpha in (1.0, 3.5)
    ]
    assert [c.index for c in spec.configurations] == list(range(8))
    assert len({c.config_id for c in spec.configurations}) == 8
    assert {c.rate_scale for c in spec.configurations} == {1.0}
    # No policy: every default policy of the topology.
    cluster = spec_from_mapping({"trace": str(a), "topology": "cluster"})
    assert [c.policy for c in cluster.configurations] == list(DEFAULT_POLICIES["cluster"])
    # The replay arguments carry the knobs.
    argv = spec.configurations[1].argv()
    assert argv[argv.index("--alpha") + 1] == "3.5"
    assert argv[argv.index("--slo-ttft") + 1] == "2.0"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("trace: {a}\ngrid:\n  alpah: [1, 2]\n", "s.yaml:3: alpah: unknown key"),
        ("trace: {a}\ngrid:\n  alpha: 2\n", "s.yaml:3: alpha: a grid key takes a non-empty list"),
        ("trace: {a}\nalpha: 1\ngrid:\n  alpha: [2]\n", "s.yaml:4: alpha: is also fixed at"),
        ("trace: {a}\ngrid:\n  alpha:\n    - 1\n    - x\n", "s.yaml:5: alpha: must be a number"),
        ("trace: {a}\ngrid:\n  rate_scale: [1, 1.0]\n", "s.yaml:3: rate_scale: lists 1.0 twice"),
        ("trace: {a}\nrate_scale: -2\n", "s.yaml:2: rate_scale: must be a number > 0"),
        ("trace: nowhere.jsonl\n", "s.yaml:1: trace: no such file: nowhere.jsonl"),
        ("slo_ttft: 1\n", "s.yaml: trace: missing"),
        (
            "trace: {a}\ntopology: cluster\npolicy: lvf\n",
            "s.yaml:3: policy: unknown policy 'lvf' for topology cluster",
        ),
        ("trace: {a}\ngrid: [alpha]\n", "s.yaml:2: grid: must be a mapping"),
    ],
)
def test_a_bad_sweep_file_is_named_with_its_line_and_key(
    capsys: pytest.CaptureFixture[str],
    traces: tuple[Path, Path],
    tmp_path: Path,
    text: str,
    expected: str,
) -> None:
    path = tmp_path / "s.yaml"
    path.write_text(text.format(a=traces[0]), encoding="utf-8")
    with pytest.raises(ConfigError, match="^" + str(tmp_path)):
        read_spec(path)
    code, _, err = run(capsys, "sweep", str(path), "--out", str(tmp_path / "o.csv"))
    assert code == 2
    assert err.strip().startswith(f"planner sweep: {tmp_path}/{expected}")
    assert "Traceback" not in err
    assert not (tmp_path / "o.csv").exists()


def test_a_value_the_replay_refuses_is_named_with_its_line(
    capsys: pytest.CaptureFixture[str], traces: tuple[Path, Path], tmp_path: Path
) -> None:
    path = tmp_path / "s.yaml"
    path.write_text(f"trace: {traces[0]}\npolicy: fcfs\ngrid:\n  slo_ttft: [-1]\n")
    code, _, err = run(capsys, "sweep", str(path), "--out", str(tmp_path / "o.csv"), "--jobs", "1")
    assert code == 2
    assert err.startswith(
        f"planner sweep: {path}:4: slo_ttft: --slo-ttft must be a finite number > 0, got -1.0"
    )


def test_rows_lead_with_goodput_and_a_sweep_resumes_where_it_stopped(
    capsys: pytest.CaptureFixture[str], traces: tuple[Path, Path], tmp_path: Path
) -> None:
    path = tmp_path / "s.yaml"
    out = tmp_path / "rows.csv"
    path.write_text(
        f"trace: {traces[0]}\nout: {out}\ngrid:\n  policy: [fcfs, lvf]\n", encoding="utf-8"
    )
    code, stdout, err = run(capsys, "sweep", str(path), "--jobs", "1", "--quiet")
    assert code == 0, err
    assert "2 configurations (2 run, 0 already there)" in stdout
    first = pd.read_csv(out)
    columns = list(first.columns)
    assert columns[:6] == ["config_id", "trace", "topology", "profile", "policy", "rate_scale"]
    assert columns[6 : 6 + len(LEADING_METRICS)] == list(LEADING_METRICS)
    assert columns[-1] == WALL_S
    assert not any("sim_speed" in c for c in columns)
    # A larger grid runs only what the table lacks; the earlier rows stay as
    # they were (their wall times too: they were not run again).
    path.write_text(
        f"trace: {traces[0]}\nout: {out}\ngrid:\n  policy: [fcfs, lvf]\n  rate_scale: [1, 4]\n",
        encoding="utf-8",
    )
    code, stdout, err = run(capsys, "sweep", str(path), "--jobs", "1", "--quiet")
    assert code == 0, err
    assert "4 configurations (2 run, 2 already there)" in stdout
    second = pd.read_csv(out)
    assert list(second.policy) == ["fcfs", "fcfs", "lvf", "lvf"]
    assert list(second.rate_scale) == [1.0, 4.0, 1.0, 4.0]
    again = second.set_index("config_id").loc[first.config_id].reset_index()
    pd.testing.assert_frame_equal(again[columns], first)
    code, stdout, _ = run(capsys, "sweep", str(path), "--jobs", "1", "--quiet")
    assert "4 configurations (0 run, 4 already there)" in stdout


def _rows(table: pd.DataFrame) -> pd.DataFrame:
    return table.drop(columns=[WALL_S]).reset_index(drop=True)


def test_worker_processes_give_the_rows_of_one_process(
    traces: tuple[Path, Path], tmp_path: Path
) -> None:
    spec = {
        "grid": {
            "trace": [str(traces[0]), str(traces[1])],
            "policy": ["fcfs", "lvf"],
            "max_batched_tokens": [512, 2048],
        }
    }
    one = sweep(spec, jobs=1)
    two = sweep(spec, jobs=2, out=tmp_path / "two.parquet")
    assert len(one) == 8
    pd.testing.assert_frame_equal(_rows(one), _rows(two))
    pd.testing.assert_frame_equal(_rows(pd.read_parquet(tmp_path / "two.parquet")), _rows(two))
    # The long-context replay's solver stops on its node limit, not the clock.
    longctx = tmp_path / "longctx.jsonl"
    lines = (ROOT / "fixtures" / "traces" / "longctx.jsonl").read_text().splitlines()[:4]
    longctx.write_text("\n".join(lines) + "\n", encoding="utf-8")
    orbit = {
        "trace": str(longctx),
        "topology": "long-context",
        "policy": "orbitflow",
        "grid": {"offload_node_limit": [50, 4000]},
    }
    one = sweep(orbit, jobs=1)
    two = sweep(orbit, jobs=2)
    pd.testing.assert_frame_equal(_rows(one), _rows(two))
    assert set(one["offload.solves.over_time_limit"]) == {0}
    assert (one["offload.solves.solves"] > 0).all()


RAY_MISSING = importlib.util.find_spec("ray") is None
NEEDS_RAY = pytest.mark.skipif(
    RAY_MISSING and not os.environ.get("PLANNER_REQUIRE_RAY"),
    reason="ray is not installed (pip install 'planner[ray]'; make's .venv has it)",
)


@pytest.fixture
def ray_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A home of the test's own for a new local Ray instance, which writes
    its token in ~/.ray (a CI home may be read-only); Ray's token mode,
    which ray.init sets in this process's environment, undone after."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("RAY_AUTH_MODE", "token")
    return home


@NEEDS_RAY
def test_a_local_ray_instance_gives_the_rows_of_one_process(
    traces: tuple[Path, Path], tmp_path: Path, ray_home: Path
) -> None:
    import ray  # noqa: PLC0415 (optional; its absence skips the test above)

    spec = {"grid": {"trace": [str(t) for t in traces], "policy": ["fcfs", "lvf"]}}
    one = sweep(spec, jobs=1)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        on_ray = sweep(spec, ray="auto", out=tmp_path / "ray.csv")
        assert ray.is_initialized()  # the caller's instance is left running
    finally:
        ray.shutdown()
    pd.testing.assert_frame_equal(_rows(one), _rows(on_ray))
    assert len(pd.read_csv(tmp_path / "ray.csv")) == 4


def test_rows_report_solves_the_clock_stopped(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """Each long-context row counts its solves stopped by the wall-clock
    backstop; with the default limits (a node limit far inside 10 s) none
    is, so the sweep warns of nothing. Which rows the warning counts is
    checked on a table, since a clock stop itself depends on the machine."""
    longctx = tmp_path / "longctx.jsonl"
    lines = (ROOT / "fixtures" / "traces" / "longctx.jsonl").read_text().splitlines()[:4]
    longctx.write_text("\n".join(lines) + "\n", encoding="utf-8")
    path = tmp_path / "s.yaml"
    path.write_text(
        f"trace: {longctx}\ntopology: long-context\npolicy: orbitflow\n"
        "grid:\n  offload_node_limit: [200, 4000]\n",
        encoding="utf-8",
    )
    out = tmp_path / "rows.csv"
    code, _, err = run(capsys, "sweep", str(path), "--out", str(out), "--jobs", "1", "--quiet")
    assert code == 0, err
    rows = pd.read_csv(out)
    assert list(rows[OVER_TIME_LIMIT]) == [0, 0]
    assert "wall-clock backstop" not in err
    table = pd.DataFrame({OVER_TIME_LIMIT: [3, 0, None, 1]})
    assert clock_limited_rows(table) == 2
    assert clock_limited_rows(pd.DataFrame({"goodput": [0.5]})) == 0


@NEEDS_RAY
def test_a_local_ray_instance_that_cannot_start_is_one_line(
    capsys: pytest.CaptureFixture[str], traces: tuple[Path, Path], ray_home: Path
) -> None:
    """`--ray local` where Ray cannot write its token (its home is a file
    here; read-only on some CI machines): exit 2, one line naming --ray."""
    ray_home.rmdir()
    ray_home.write_text("not a folder", encoding="utf-8")
    path = ray_home.parent / "s.yaml"
    path.write_text(f"trace: {traces[0]}\npolicy: fcfs\n", encoding="utf-8")
    out = ray_home.parent / "rows.csv"
    code, _, err = run(capsys, "sweep", str(path), "--ray", "local", "--out", str(out), "--quiet")
    assert code == 2, err
    (line,) = err.strip().splitlines()
    assert "--ray local: " in line
