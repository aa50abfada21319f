"""The `planner` command, run as a user runs it: a subprocess."""

from __future__ import annotations

import json
import os
import queue
import re
import signal
import socket
import subprocess
import sys
import threading
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import pytest
from google.protobuf import json_format

import planner
from planner.rpc import RPCS
from planner.service.limits import ServiceLimits
from planner.service.methods import CallContext, handle
from planner.v1 import rotation_pb2

REPO_ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = REPO_ROOT / "fixtures" / "rotation" / "example_request.json"
PLANNER = Path(sys.executable).parent / "planner"
PLAN = "RotationService.PlanRotation"
TIMEOUT_S = 60


def run_planner(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(PLANNER), *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        cwd=REPO_ROOT,
        check=False,
    )


def assert_one_line_error(result: subprocess.CompletedProcess[str], exit_code: int) -> str:
    assert result.returncode == exit_code, result.stderr
    assert result.stdout == ""
    assert "Traceback" not in result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("planner call: ")
    return lines[0]


def example_dict() -> dict:
    return json.loads(EXAMPLE.read_text(encoding="utf-8"))


def in_process_response() -> rotation_pb2.PlanRotationResponse:
    request = json_format.Parse(EXAMPLE.read_text(encoding="utf-8"), RPCS[PLAN].request_type())
    response = handle(RPCS[PLAN], request, CallContext(ServiceLimits()))
    assert isinstance(response, rotation_pb2.PlanRotationResponse)
    return response


def test_console_script_is_installed():
    assert PLANNER.is_file(), PLANNER


def test_version():
    result = run_planner("--version")
    assert result.returncode == 0
    assert result.stdout.strip() == f"planner {planner.__version__}"


def test_no_command_prints_help_and_exits_2():
    result = run_planner()
    assert result.returncode == 2
    assert "call" in result.stderr
    assert "serve" in result.stderr


def test_call_in_process_prints_the_plan_as_proto3_json():
    result = run_planner("call", PLAN, "--json", str(EXAMPLE))
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    out = json.loads(result.stdout)
    plan = out["plan"]
    assert [d["id"] for d in plan["prioritized"]] == ["a", "c"]
    assert [d["state"] for d in plan["prioritized"]] == ["WAITING", "ROTARY"]
    assert [d["vlt"] for d in plan["prioritized"]] == pytest.approx([5.5, 0.9])
    assert [(d["id"], d["vlt"]) for d in plan["preempted"]] == [("b", -9.0)]
    assert plan["fcfs_fallback"] is False
    # proto3 JSON: int64 as strings, enums by name.
    assert plan["prioritized"][0]["blocks"] == "31"
    assert plan["explanation"]["budget_source"] == "BUDGET_SOURCE_GIVEN"
    # It parses back into exactly what the handler answers.
    parsed = json_format.Parse(result.stdout, rotation_pb2.PlanRotationResponse())
    assert parsed == in_process_response()


def test_call_reads_stdin():
    result = run_planner("call", PLAN, stdin=EXAMPLE.read_text(encoding="utf-8"))
    assert result.returncode == 0, result.stderr
    assert json_format.Parse(result.stdout, rotation_pb2.PlanRotationResponse()) == (
        in_process_response()
    )


def test_call_planner_info():
    result = run_planner("call", "PlannerInfoService.GetPlannerInfo", stdin="{}")
    assert result.returncode == 0, result.stderr
    info = json.loads(result.stdout)
    assert info["version"] == planner.__version__
    assert "planner.v1.RotationService" in info["services"]


def _mutated(mutate) -> str:
    d = example_dict()
    mutate(d)
    return json.dumps(d)


def _set_request(index: int, key: str, value: object):
    return lambda d: d["snapshot"]["requests"][index].__setitem__(key, value)


BAD_JSON_CASES = [
    pytest.param(
        _mutated(_set_request(2, "id", "a")),
        ["snapshot.requests[2].id", "snapshot.requests[0]"],
        id="duplicate_id",
    ),
    pytest.param(
        _mutated(lambda d: d["snapshot"].__setitem__("free_gpu_blocks", -1)),
        ["snapshot.free_gpu_blocks"],
        id="negative_free_gpu_blocks",
    ),
    pytest.param(
        _mutated(lambda d: d["slo"].__setitem__("ttft_s", 0)), ["slo.ttft_s"], id="slo_zero"
    ),
    pytest.param('{"snapshot": {', ["not a valid PlanRotation JSON"], id="malformed_json"),
    pytest.param("", ["not a valid PlanRotation JSON"], id="empty_input"),
    pytest.param(
        _mutated(lambda d: d.__setitem__("bogus", 1)),
        ['no field named "bogus"'],
        id="unknown_field",
    ),
    pytest.param(
        _mutated(_set_request(0, "colour", "red")),
        ['no field named "colour"', "snapshot.requests[0]"],
        id="unknown_nested_field",
    ),
    pytest.param(
        _mutated(lambda d: d["snapshot"].__setitem__("now_s", "ten")),
        ["now_s"],
        id="wrong_type_float",
    ),
    pytest.param(
        _mutated(lambda d: d["snapshot"].__setitem__("free_gpu_blocks", 1.5)),
        ["free_gpu_blocks"],
        id="wrong_type_int",
    ),
    pytest.param(
        _mutated(_set_request(1, "state", "SLEEPING")),
        ["SLEEPING", "snapshot.requests[1].state"],
        id="unknown_enum_name",
    ),
]


@pytest.mark.parametrize(("text", "expected"), BAD_JSON_CASES)
def test_call_bad_input_exits_2_with_one_line(tmp_path, text, expected):
    path = tmp_path / "request.json"
    path.write_text(text, encoding="utf-8")
    line = assert_one_line_error(run_planner("call", PLAN, "--json", str(path)), 2)
    for fragment in expected:
        assert fragment in line


def test_call_unknown_method_exits_2():
    line = assert_one_line_error(run_planner("call", "RotationService.Nope", "--json", "-"), 2)
    assert "'RotationService.Nope'" in line
    assert PLAN in line  # lists the known ones


def test_call_missing_file_exits_2(tmp_path):
    missing = tmp_path / "nope.json"
    line = assert_one_line_error(run_planner("call", PLAN, "--json", str(missing)), 2)
    assert str(missing) in line


@pytest.fixture
def dead_port() -> Iterator[int]:
    """Bound but not listening: connections to it are refused."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        yield s.getsockname()[1]


def test_call_dead_target_exits_1_with_one_line(dead_port):
    result = run_planner("call", PLAN, "--json", str(EXAMPLE), "--target", f"127.0.0.1:{dead_port}")
    line = assert_one_line_error(result, 1)
    assert "UNAVAILABLE" in line


# --- planner serve --------------------------------------------------------------


@dataclass
class Serve:
    proc: subprocess.Popen[str]
    address: str
    lines: queue.Queue[str | None]
    stderr_path: Path

    def next_line(self, timeout: float = TIMEOUT_S) -> str | None:
        return self.lines.get(timeout=timeout)

    def stderr(self) -> str:
        return self.stderr_path.read_text(encoding="utf-8")


def _pump(stream: IO[str], lines: queue.Queue[str | None]) -> None:
    for line in stream:
        lines.put(line.rstrip("\n"))
    lines.put(None)


def start_serve(tmp_path: Path, *extra: str) -> Serve:
    stderr_path = tmp_path / "serve.stderr"
    with stderr_path.open("w", encoding="utf-8") as stderr:
        proc = subprocess.Popen(
            [str(PLANNER), "serve", "--port", "0", *extra],
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
            cwd=REPO_ROOT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
    lines: queue.Queue[str | None] = queue.Queue()
    assert proc.stdout is not None
    threading.Thread(target=_pump, args=(proc.stdout, lines), daemon=True).start()
    first = lines.get(timeout=TIMEOUT_S)
    match = re.fullmatch(r"planner serving on (127\.0\.0\.1:\d+)", first or "")
    assert match, f"unexpected first line {first!r}; stderr: {stderr_path.read_text()}"
    return Serve(proc, match.group(1), lines, stderr_path)


@pytest.fixture
def serve(tmp_path) -> Iterator[Serve]:
    s = start_serve(tmp_path, "--metrics-port", "0")
    yield s
    if s.proc.poll() is None:
        s.proc.kill()
        s.proc.wait(timeout=TIMEOUT_S)


def test_call_with_target_answers_like_in_process(serve, tmp_path):
    metrics_line = serve.next_line()
    match = re.fullmatch(r"metrics on (http://127\.0\.0\.1:\d+/metrics)", metrics_line or "")
    assert match, metrics_line

    local = run_planner("call", PLAN, "--json", str(EXAMPLE))
    remote = run_planner("call", PLAN, "--json", str(EXAMPLE), "--target", serve.address)
    assert remote.returncode == 0, remote.stderr
    assert remote.stdout == local.stdout
    assert json.loads(remote.stdout)["plan"]["prioritized"][0]["id"] == "a"

    # Bad input over gRPC: also exit 2 and one line naming the field.
    bad = tmp_path / "bad.json"
    bad.write_text(_mutated(_set_request(2, "id", "a")), encoding="utf-8")
    line = assert_one_line_error(
        run_planner("call", PLAN, "--json", str(bad), "--target", serve.address), 2
    )
    assert "INVALID_ARGUMENT" in line
    assert "snapshot.requests[2].id" in line

    # The server counted both calls.
    with urllib.request.urlopen(match.group(1), timeout=TIMEOUT_S) as response:
        text = response.read().decode()
    rpc = 'grpc_method="PlanRotation",grpc_service="planner.v1.RotationService"'
    ok = f'grpc_server_handling_seconds_count{{grpc_code="OK",{rpc},grpc_type="unary"}} 1.0'
    bad_sample = (
        f'grpc_server_handled_total{{grpc_code="INVALID_ARGUMENT",{rpc},grpc_type="unary"}} 1.0'
    )
    assert ok in text
    assert bad_sample in text


@pytest.mark.parametrize(
    ("sig", "call_first"),
    [
        pytest.param(signal.SIGTERM, True, id="SIGTERM"),
        # Signalled as soon as it says it is serving: handlers are in place.
        pytest.param(signal.SIGTERM, False, id="SIGTERM-at-once"),
        pytest.param(signal.SIGINT, False, id="SIGINT-at-once"),
    ],
)
def test_serve_stops_gracefully_on_signal(tmp_path, sig, call_first):
    s = start_serve(tmp_path, "--log-format", "json")
    try:
        if call_first:
            ok = run_planner("call", PLAN, "--json", str(EXAMPLE), "--target", s.address)
            assert ok.returncode == 0, ok.stderr
        s.proc.send_signal(sig)
        assert s.proc.wait(timeout=TIMEOUT_S) == 0
    finally:
        if s.proc.poll() is None:
            s.proc.kill()
            s.proc.wait(timeout=TIMEOUT_S)
    assert s.next_line() is None  # nothing more on stdout
    events = [json.loads(line)["event"] for line in s.stderr().splitlines()]
    assert events[0] == "serving"
    assert events[-1] == "stopped"
    assert "Traceback" not in s.stderr()


def test_serve_rejects_bad_limits():
    result = run_planner("serve", "--port", "0", "--max-workers", "0")
    assert result.returncode == 2
    assert result.stderr.strip() == "planner serve: --max-workers must be > 0"


def test_serve_metrics_port_in_use_exits_1():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = run_planner("serve", "--port", "0", "--metrics-port", str(port))
    assert result.returncode == 1
    assert result.stdout == ""
    assert f"cannot serve metrics on 127.0.0.1:{port}" in result.stderr
    assert "Traceback" not in result.stderr
