"""Output paths are checked before a run: `planner replay` and `planner trace
gen` refuse an output they could not write (a folder given for a file, a
file given for a folder, a path under a file, a folder they cannot write in)
with exit code 2 and one line, before any work; a write that still fails at
the end (here a real file-size limit, as a full disk would) is one line and
exit code 1, never a traceback. Absurd --rate-scale values are refused."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from planner.cli import main

REPO_ROOT = Path(__file__).resolve().parents[2]
TRACE = REPO_ROOT / "fixtures" / "traces" / "default.jsonl"


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def refused(code: int, out: str, err: str, *expected: str) -> None:
    assert code == 2, err
    assert out == "", "nothing ran before the refusal"
    (line,) = err.strip().splitlines()
    for text in expected:
        assert text in line, line


def test_replay_refuses_unwritable_outputs_before_running(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    replay = ("replay", str(TRACE), "--quiet", "--policy", "fcfs")
    a_file = tmp_path / "file"
    a_file.write_text("x")
    refused(*run(capsys, *replay, "--json-out", str(tmp_path)), "--json-out", "is a folder")
    refused(
        *run(capsys, *replay, "--json-out", str(a_file / "r.json")),
        f"{a_file} is not a folder",
    )
    refused(*run(capsys, *replay, "--report-dir", str(a_file)), "--report-dir", "is not a folder")
    refused(*run(capsys, *replay, "--json-out", "/dev/null"), "is not a regular file")
    if Path("/proc/self").is_dir():
        # Not even root can create files in /proc.
        refused(
            *run(capsys, *replay, "--json-out", "/proc/planner/r.json"), "cannot write in /proc"
        )
    # A folder that does not exist yet is fine: the writer creates it.
    code, _, err = run(capsys, *replay, "--json-out", str(tmp_path / "new" / "r.json"))
    assert code == 0, err
    assert (tmp_path / "new" / "r.json").is_file()


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes in read-only folders")
def test_replay_refuses_a_read_only_folder(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        refused(
            *run(capsys, "replay", str(TRACE), "--json-out", str(locked / "r.json")),
            f"cannot write in {locked}",
        )
    finally:
        locked.chmod(0o700)


def test_trace_gen_refuses_a_folder_for_its_output(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    refused(
        *run(capsys, "trace", "gen", "--rate", "1", "--duration", "5", "-o", str(tmp_path)),
        "--output",
        "is a folder",
    )


def test_a_write_that_fails_at_the_end_is_one_line(tmp_path: Path) -> None:
    # The size limit lets the check's empty file through and stops the JSON.
    code = (
        "import os, resource, sys; "
        "resource.setrlimit(resource.RLIMIT_FSIZE, (1024, resource.RLIM_INFINITY)); "
        "os.execv(sys.argv[1], sys.argv[1:])"
    )
    out = tmp_path / "r.json"
    replay = ["replay", str(TRACE), "--quiet", "--policy", "fcfs", "--json-out", str(out)]
    done = subprocess.run(
        [sys.executable, "-c", code, sys.executable, "-m", "planner.cli", *replay],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        timeout=300,
        check=False,
    )
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("planner replay: cannot write") and "too large" in line, line
    assert not out.exists()
    assert [p.name for p in tmp_path.iterdir()] == []


@pytest.mark.parametrize(
    ("scale", "expected"),
    [
        ("1e-300", "stretches the trace to 1.2e+302 s, more than a year"),
        ("1e-6", "stretches the trace to 1.2e+08 s"),
        ("1e7", "--rate-scale must be at most 1e+06, got 1e+07"),
        ("0", "--rate-scale must be a finite number > 0"),
    ],
)
def test_absurd_rate_scales_are_refused(
    scale: str, expected: str, capsys: pytest.CaptureFixture[str]
) -> None:
    refused(*run(capsys, "replay", str(TRACE), "--rate-scale", scale), expected)
