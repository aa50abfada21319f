"""`planner trace import|gen|stats` as a user runs them: exit codes, one-line
errors naming file:line and field, nothing written on failure."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from planner_cli import one_line, run_planner

from planner.cli import main
from planner.trace import load_trace

PLANNER = Path(sys.executable).parent / "planner"

AZURE = (
    "TIMESTAMP,ContextTokens,GeneratedTokens\n"
    "2023-11-16 18:15:46.6805900,374,44\n"
    "2023-11-16 18:15:50.9951690,396,0\n"
    "2023-11-16 18:16:46.6805901,879,55\n"
)


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    return run_planner(capsys, "trace", *args)


def test_gen_then_stats(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "g.jsonl"
    code, stdout, _ = run(
        capsys, "gen", "--rate", "5", "--duration", "60", "--seed", "1", "-o", str(out)
    )
    assert code == 0
    assert "generated" in stdout and "preset sharegpt" in stdout
    requests = load_trace(out)
    assert 200 < len(requests) < 400
    code, stdout, _ = run(capsys, "stats", str(out))
    assert code == 0
    assert f"{len(requests):,}" in stdout and "burstiness" in stdout and "p99" in stdout
    code, stdout, _ = run(capsys, "stats", str(out), "--json", "--window", "10")
    assert code == 0
    stats = json.loads(stdout)
    assert stats["requests"] == len(requests)
    assert stats["windows"]["window_s"] == 10.0 and stats["windows"]["full_windows"] == 5


def test_gen_is_deterministic_and_stamps(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = [
        "gen",
        "--rate-schedule",
        "0:2,10:8",
        "--burstiness",
        "2",
        "--num-requests",
        "50",
        "--lengths",
        "azure-code",
        "--max-prompt-tokens",
        "4096",
        "--model",
        "llama",
        "--slo-ttft-s",
        "2",
        "--id-prefix",
        "q",
        "--seed",
        "9",
    ]
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    assert run(capsys, *args, "-o", str(a))[0] == 0
    assert run(capsys, *args, "-o", str(b))[0] == 0
    assert a.read_bytes() == b.read_bytes()
    requests = load_trace(a)
    assert len(requests) == 50
    assert [r.id for r in requests[:2]] == ["q0", "q1"]
    assert {r.model for r in requests} == {"llama"} and {r.slo_ttft_s for r in requests} == {2.0}
    assert max(r.prompt_tokens for r in requests) <= 4096


def test_import_prints_a_summary(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = tmp_path / "azure.csv"
    src.write_text(AZURE)
    out = tmp_path / "out.jsonl"
    code, stdout, _ = run(capsys, "import", "--format", "azure", str(src), "-o", str(out))
    assert code == 0
    assert "3 rows read" in stdout and "3 written" in stdout
    assert "changed 1 rows: GeneratedTokens 0 set to 1" in stdout
    assert [r.output_tokens for r in load_trace(out)] == [44, 1, 55]


def test_import_bad_row_exits_2_naming_file_line_column(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = tmp_path / "azure.csv"
    src.write_text(AZURE + "2023-11-16 18:17:00,12x,5\n")
    out = tmp_path / "out.jsonl"
    code, stdout, err = run(capsys, "import", "--format", "azure", str(src), "-o", str(out))
    assert code == 2
    assert one_line(err) == (
        f'planner trace import: {src}:5: ContextTokens: must be an integer >= 0, got "12x"'
    )
    assert not out.exists() and stdout == ""
    assert [p.name for p in tmp_path.iterdir()] == ["azure.csv"]  # no temporary left


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--format", "azure", "--rate", "5"], "--rate: does not apply to --format azure"),
        (["--format", "azure", "--lengths", "sharegpt"], "--lengths: does not apply"),
        (["--format", "sharegpt-lengths"], "--rate: sharegpt-lengths has no timestamps"),
        (["--format", "sharegpt-lengths", "--rate", "-1"], "--rate: must be a finite number > 0"),
        (["--format", "alibaba"], "alibaba has no token counts"),
        (["--format", "alibaba", "--lengths", "nope"], "unknown preset 'nope'"),
        (
            ["--format", "alibaba", "--prompt-tokens", "5", "--prompt-lengths", "fixed:5"],
            "--prompt-tokens: cannot be combined",
        ),
        (["--format", "azure", "--limit", "0"], "--limit: must be >= 1"),
        (["--format", "azure", "--start", "-5"], "--start: must be a finite number >= 0"),
        (["--format", "azure", "--slo-tbt-s", "0"], "--slo-tbt-s: must be a finite number > 0"),
    ],
)
def test_import_bad_options_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    src = tmp_path / "src.csv"
    src.write_text(AZURE)
    out = tmp_path / "out.jsonl"
    code, _, err = run(capsys, "import", *args, str(src), "-o", str(out))
    assert code == 2
    assert message in one_line(err)
    assert not out.exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--duration", "10"], "--rate: give --rate RPS or --rate-schedule"),
        (["--rate", "5"], "give --duration or --num-requests"),
        (["--rate", "5", "--duration", "10", "--lengths", "gauss:x=1"], "unknown distribution"),
        (["--rate-schedule", "0:5,x", "--duration", "10"], "--rate-schedule: expected"),
        (["--rate", "5", "--duration", "10", "--max-output-tokens", "0"], "must be >= 1"),
        (
            ["--rate", "5", "--duration", "10", "--lengths", "sharegpt", "--lengths-file", "x.csv"],
            "--lengths-file: cannot be combined",
        ),
        (["--rate", "0.001", "--duration", "1", "--seed", "1"], "no arrival falls"),
    ],
)
def test_gen_bad_options_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    out = tmp_path / "out.jsonl"
    code, _, err = run(capsys, "gen", *args, "-o", str(out))
    assert code == 2
    assert message in one_line(err)
    assert not out.exists()


def test_gen_lengths_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    lengths = tmp_path / "l.csv"
    lengths.write_text("ContextTokens,GeneratedTokens\n100,10\n")
    out = tmp_path / "out.jsonl"
    code, stdout, _ = run(
        capsys, "gen", "--rate", "5", "--num-requests", "3", "--lengths-file", str(lengths),
        "-o", str(out),
    )  # fmt: skip
    assert code == 0 and "resampled from l.csv (1 pairs)" in stdout
    assert {(r.prompt_tokens, r.output_tokens) for r in load_trace(out)} == {(100, 10)}
    lengths.write_text("ContextTokens,GeneratedTokens\n100,ten\n")
    code, _, err = run(
        capsys, "gen", "--rate", "5", "--num-requests", "3", "--lengths-file", str(lengths),
        "-o", str(out),
    )  # fmt: skip
    assert code == 2 and f"{lengths}:2: GeneratedTokens:" in one_line(err)


def test_stats_bad_and_unsorted_traces(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text(
        '{"arrival_s": 2, "prompt_tokens": 1, "output_tokens": 1}\n'
        '{"arrival_s": 1, "prompt_tokens": 1, "output_tokens": 1}\n'
    )
    code, _, err = run(capsys, "stats", str(path))
    assert code == 2
    assert one_line(err).startswith(f"planner trace stats: {path}:2: arrival_s: arrivals must")
    assert run(capsys, "stats", str(path), "--sort")[0] == 0
    code, _, err = run(capsys, "stats", str(path), "--sort", "--window", "0")
    assert code == 2 and "--window" in one_line(err)
    code, _, err = run(capsys, "stats", str(tmp_path / "missing.jsonl"))
    assert code == 2 and "cannot read" in one_line(err)


def test_unwritable_output_exits_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "no" / "such" / "dir" / "out.jsonl"
    code, _, err = run(capsys, "gen", "--rate", "5", "--num-requests", "3", "-o", str(out))
    assert code == 1 and "cannot write" in one_line(err)


def test_help_documents_formats_and_lengths(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["trace", "import", "--help"])
    assert info.value.code == 0
    text = capsys.readouterr().out
    for name in ("azure", "mooncake", "burstgpt", "sharegpt-lengths", "alibaba", "--lengths-file"):
        assert name in text
    assert main(["trace"]) == 2


def test_real_process_bad_line_no_traceback(tmp_path: Path) -> None:
    path = tmp_path / "trace.jsonl"
    good = '{"arrival_s": 0, "prompt_tokens": 1, "output_tokens": 1}\n'
    path.write_text(good * 16 + '{"arrival_s": 1, "prompt_tokens": -3, "output_tokens": 1}\n')
    proc = subprocess.run(
        [str(PLANNER), "trace", "stats", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 2
    assert proc.stderr == (
        f"planner trace stats: {path}:17: prompt_tokens: must be an integer >= 1, got -3\n"
    )
    assert proc.stdout == ""
