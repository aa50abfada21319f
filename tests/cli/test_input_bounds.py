"""Input files of `planner trace stats`, `planner replay` and `planner call
--json` are bounded: special files are refused before a byte is read, a line
or a file over its size limit is refused with one line naming it, and
standard input ("-") still works. Where an unbounded reader would never
stop (/dev/zero, endless standard input) the command runs as a real process
whose address space is capped at 1 GiB, so it would fail with MemoryError
instead of taking the machine's memory; the rest run in process."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

import pytest

from planner.cli import main
from planner.trace.io import MAX_LINE_BYTES

REPO_ROOT = Path(__file__).resolve().parents[2]
TRACE = REPO_ROOT / "fixtures" / "traces" / "default.jsonl"
ADDRESS_SPACE_BYTES = 1 << 30
GOOD_LINE = '{"arrival_s": 0.5, "prompt_tokens": 12, "output_tokens": 3}\n'

COMMANDS = {
    "stats": ("trace", "stats"),
    "replay": ("replay", "--quiet"),
    "call": ("call", "PlannerInfoService.GetPlannerInfo", "--json"),
}


def planner(
    *args: str, stdin: bytes | None = None, stdin_path: str | None = None
) -> tuple[int, str]:
    """Runs planner with RLIMIT_AS at ADDRESS_SPACE_BYTES; (exit code, stderr)."""
    code = (
        "import os, resource, sys; "
        f"resource.setrlimit(resource.RLIMIT_AS, ({ADDRESS_SPACE_BYTES}, {ADDRESS_SPACE_BYTES})); "
        "os.execv(sys.argv[1], sys.argv[1:])"
    )
    command = [sys.executable, "-c", code, sys.executable, "-m", "planner.cli", *args]
    if stdin_path is not None:
        with open(stdin_path, "rb") as f:
            done = subprocess.run(
                command, stdin=f, capture_output=True, cwd=REPO_ROOT, timeout=120, check=False
            )
    else:
        done = subprocess.run(
            command,
            input=stdin or b"",
            capture_output=True,
            cwd=REPO_ROOT,
            timeout=120,
            check=False,
        )
    return done.returncode, done.stderr.decode("utf-8", errors="replace")


def in_process(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    code = main(list(args))
    _, err = capsys.readouterr()
    return code, err


def assert_refused(code: int, err: str, *expected: str) -> None:
    assert code == 2, err
    assert "Traceback" not in err, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    for text in expected:
        assert text in lines[0], lines[0]


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_dev_zero_is_refused_as_a_character_device(command: str) -> None:
    code, err = planner(*COMMANDS[command], "/dev/zero")
    assert_refused(code, err, "/dev/zero", "a character device, not a regular file")


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_a_named_pipe_and_a_directory_are_refused(
    command: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    code, err = in_process(capsys, *COMMANDS[command], str(fifo))
    assert_refused(code, err, "a named pipe")
    code, err = in_process(capsys, *COMMANDS[command], str(tmp_path))
    assert_refused(code, err, "a directory")


@pytest.mark.parametrize("command", ["stats", "replay"])
def test_a_line_without_end_is_refused_at_the_line_limit(
    command: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "one-line.jsonl"
    path.write_bytes(b"a" * (4 * MAX_LINE_BYTES))
    code, err = in_process(capsys, *COMMANDS[command], str(path))
    assert_refused(code, err, f"{path}:1: line longer than {MAX_LINE_BYTES:,} bytes")


@pytest.mark.parametrize("command", ["stats", "replay"])
def test_endless_standard_input_stops_at_the_line_limit(command: str) -> None:
    code, err = planner(*COMMANDS[command], "-", stdin_path="/dev/zero")
    assert_refused(code, err, "standard input:1: line longer than")


def test_endless_standard_input_stops_at_the_size_limit_for_call() -> None:
    code, err = planner(*COMMANDS["call"], "-", stdin_path="/dev/zero")
    assert_refused(code, err, "--json standard input: larger than 67,108,864 bytes")


def test_a_trace_over_max_trace_bytes_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text(GOOD_LINE * 100)
    size = path.stat().st_size
    code, err = in_process(capsys, "trace", "stats", str(path), "--max-trace-bytes", str(size - 1))
    assert_refused(code, err, f"{size:,} bytes, larger than {size - 1:,} bytes")
    code, _ = in_process(capsys, "trace", "stats", str(path), "--max-trace-bytes", str(size))
    assert code == 0
    # Standard input has no size to check first: it is counted while read.
    code, err = planner(
        "trace", "stats", "-", "--max-trace-bytes", str(size - 1), stdin=path.read_bytes()
    )
    assert_refused(code, err, "standard input: larger than")
    code, err = in_process(capsys, "trace", "stats", str(path), "--max-trace-bytes", "0")
    assert_refused(code, err, "--max-trace-bytes: must be > 0")


@pytest.mark.parametrize("command", ["stats", "replay"])
def test_a_deeply_nested_line_is_a_clean_error(
    command: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "deep.jsonl"
    depth = MAX_LINE_BYTES // 2 - 1
    path.write_text("[" * depth + "]" * depth + "\n")
    code, err = in_process(capsys, *COMMANDS[command], str(path))
    assert_refused(code, err, f"{path}:1: invalid JSON: nested too deeply")
    # 100,000 deep is over the line limit before it is parsed.
    path.write_text("[" * 100_000 + "]" * 100_000 + "\n")
    code, err = in_process(capsys, *COMMANDS[command], str(path))
    assert_refused(code, err, f"{path}:1: line longer than")


def test_a_deeply_nested_request_is_a_clean_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "deep.json"
    path.write_text('{"x":' * 100_000 + "1" + "}" * 100_000)
    code, err = in_process(capsys, *COMMANDS["call"], str(path))
    assert_refused(code, err, "request is not a valid GetPlannerInfo JSON")


def test_standard_input_still_works(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = TRACE.read_bytes()
    for args, data in (
        (("trace", "stats", "-"), trace),
        (("replay", "-", "--quiet", "--policy", "fcfs"), trace),
        ((*COMMANDS["call"], "-"), b"{}"),
    ):
        monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(data)))
        code, err = in_process(capsys, *args)
        assert code == 0, err
