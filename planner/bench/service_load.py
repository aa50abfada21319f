"""The measurement behind `planner bench service`: N client processes
(planner.bench.service_client) against one `planner serve` subprocess.

A phase starts the server with its limits, starts every client and waits
until each has connected and printed "ready", then releases them all at
once through their stdin and samples the server's resident memory until
they finish. After the phase one more call, made the way a fresh engine
would, shows whether the server still answers.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, Any

import grpc
import numpy as np

from planner.bench import synthetic
from planner.bench.proto_request import plan_rotation_request
from planner.bench.server_process import ServerProcess
from planner.bench.service_client import READY
from planner.rpc import RPCS
from planner.v1 import rotation_pb2

METHOD = "RotationService.PlanRotation"
# gRPC enforces a deadline on a loaded machine with some slack; a call
# answered later than its deadline plus this counts as one that hung.
DEADLINE_GRACE_MS = 100.0
RSS_SAMPLE_INTERVAL_S = 0.5
# Beyond duration + deadline, how long clients may take to write their
# outcome before the phase is declared stuck.
FINISH_TIMEOUT_S = 60.0
PROBE_DEADLINE_S = 5.0

Progress = Callable[[str], None]


class LoadError(RuntimeError):
    """A client failed to start or to finish: the phase measured nothing."""


@dataclass(frozen=True, slots=True)
class ServerLimits:
    max_workers: int = 8
    max_concurrent_rpcs: int = 64

    @property
    def label(self) -> str:
        workers = "worker" if self.max_workers == 1 else "workers"
        return f"{self.max_workers} {workers}, {self.max_concurrent_rpcs} concurrent RPCs"

    def serve_args(self) -> tuple[str, ...]:
        return (
            "--max-workers",
            str(self.max_workers),
            "--max-concurrent-rpcs",
            str(self.max_concurrent_rpcs),
        )


@dataclass(frozen=True, slots=True)
class PhaseConfig:
    name: str
    clients: int
    # Calls per second per client; 0 calls again as soon as an answer comes.
    rate_hz: float
    duration_s: float
    deadline_ms: float
    limits: ServerLimits = field(default_factory=ServerLimits)
    requests: int = 100
    form: str = "columns"
    seed: int = 0

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @staticmethod
    def from_json(data: dict[str, Any]) -> PhaseConfig:
        return PhaseConfig(**{**data, "limits": ServerLimits(**data["limits"])})


@dataclass(frozen=True, slots=True)
class CodeStats:
    """Calls that ended with one status code; latencies in ms."""

    calls: int
    p50_ms: float
    p99_ms: float
    p999_ms: float
    max_ms: float


@dataclass(frozen=True, slots=True)
class RssSample:
    t_s: float
    rss_kb: int


@dataclass(frozen=True, slots=True)
class PhaseResult:
    config: PhaseConfig
    window_s: float
    codes: dict[str, CodeStats]
    # Iterations that began late because the previous call outlasted a period.
    late_starts: int
    # Calls answered (any status) later than deadline + DEADLINE_GRACE_MS.
    over_deadline: int
    rss: list[RssSample]
    # Status code name of one plain call right after the phase.
    probe_after: str
    startup_s: float

    @property
    def calls(self) -> int:
        return sum(c.calls for c in self.codes.values())

    @property
    def errors(self) -> int:
        return self.calls - self.ok_calls

    @property
    def ok_calls(self) -> int:
        ok = self.codes.get("OK")
        return ok.calls if ok else 0

    @property
    def throughput_per_s(self) -> float:
        return self.ok_calls / self.window_s if self.window_s > 0 else 0.0

    def rss_at(self, fraction: float) -> int:
        """The sample nearest fraction of the way through the phase."""
        target = fraction * self.window_s
        return min(self.rss, key=lambda s: abs(s.t_s - target)).rss_kb

    def to_json(self) -> dict[str, Any]:
        return {
            "config": self.config.to_json(),
            "window_s": self.window_s,
            "calls": self.calls,
            "ok_calls": self.ok_calls,
            "errors": self.errors,
            "throughput_per_s": self.throughput_per_s,
            "codes": {k: asdict(v) for k, v in self.codes.items()},
            "late_starts": self.late_starts,
            "over_deadline": self.over_deadline,
            "rss_kb": {
                "start": self.rss_at(0.0),
                "middle": self.rss_at(0.5),
                "end": self.rss_at(1.0),
                "samples": [[s.t_s, s.rss_kb] for s in self.rss],
            },
            "probe_after": self.probe_after,
            "startup_s": self.startup_s,
        }

    @staticmethod
    def from_json(data: dict[str, Any]) -> PhaseResult:
        return PhaseResult(
            config=PhaseConfig.from_json(data["config"]),
            window_s=float(data["window_s"]),
            codes={k: CodeStats(**v) for k, v in data["codes"].items()},
            late_starts=int(data["late_starts"]),
            over_deadline=int(data["over_deadline"]),
            rss=[RssSample(float(t), int(kb)) for t, kb in data["rss_kb"]["samples"]],
            probe_after=str(data["probe_after"]),
            startup_s=float(data["startup_s"]),
        )


def code_stats(latencies_ns: list[int]) -> CodeStats:
    ms = np.asarray(latencies_ns, dtype=np.float64) / 1e6
    p50, p99, p999 = np.percentile(ms, [50.0, 99.0, 99.9])
    return CodeStats(len(ms), float(p50), float(p99), float(p999), float(ms.max()))


def read_rss_kb(pid: int) -> int:
    """VmRSS of a live process, from /proc/PID/status."""
    for line in Path(f"/proc/{pid}/status").read_text(encoding="utf-8").splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise LoadError(f"no VmRSS in /proc/{pid}/status")


def build_request(config: PhaseConfig) -> rotation_pb2.PlanRotationRequest:
    return plan_rotation_request(synthetic.generate(config.requests, config.seed), config.form)


def _client_command(config: PhaseConfig, target: str, request_file: Path, out: Path) -> list[str]:
    return [
        sys.executable,
        "-m",
        "planner.bench.service_client",
        "--target",
        target,
        "--method",
        RPCS[METHOD].full_path,
        "--request-file",
        str(request_file),
        "--rate-hz",
        repr(config.rate_hz),
        "--duration-s",
        repr(config.duration_s),
        "--deadline-ms",
        repr(config.deadline_ms),
        "--out",
        str(out),
    ]


def _start_clients(
    config: PhaseConfig, target: str, folder: Path, request_file: Path
) -> list[subprocess.Popen[str]]:
    clients = []
    for i in range(config.clients):
        stderr = (folder / f"client-{i}.err").open("w", encoding="utf-8")
        try:
            clients.append(
                subprocess.Popen(
                    _client_command(config, target, request_file, folder / f"client-{i}.json"),
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=stderr,
                    text=True,
                )
            )
        finally:
            stderr.close()
    return clients


def _await_ready(clients: list[subprocess.Popen[str]], folder: Path) -> None:
    for i, proc in enumerate(clients):
        stdout: IO[str] | None = proc.stdout
        assert stdout is not None
        line = stdout.readline().strip()
        if line != READY:
            err = (folder / f"client-{i}.err").read_text(encoding="utf-8")[-1500:]
            raise LoadError(f"client {i} did not start: {err or line or 'no output'}")


def _release(clients: list[subprocess.Popen[str]]) -> None:
    for proc in clients:
        assert proc.stdin is not None
        proc.stdin.write("go\n")
        proc.stdin.flush()


def _watch(
    clients: list[subprocess.Popen[str]], server_pid: int, limit_s: float
) -> list[RssSample]:
    """Samples the server's RSS until every client exits; kills them all
    and raises when they outlast limit_s."""
    start = time.monotonic()
    samples = [RssSample(0.0, read_rss_kb(server_pid))]
    for proc in clients:
        while proc.poll() is None:
            elapsed = time.monotonic() - start
            if elapsed > limit_s:
                for p in clients:
                    p.kill()
                raise LoadError(f"clients still running after {limit_s:.0f} s")
            try:
                proc.wait(RSS_SAMPLE_INTERVAL_S)
            except subprocess.TimeoutExpired:
                samples.append(
                    RssSample(round(time.monotonic() - start, 3), read_rss_kb(server_pid))
                )
    samples.append(RssSample(round(time.monotonic() - start, 3), read_rss_kb(server_pid)))
    return samples


def _probe(address: str, request: rotation_pb2.PlanRotationRequest) -> str:
    """Status of one plain PlanRotation call on a fresh channel, no retries."""
    with grpc.insecure_channel(address, options=[("grpc.enable_retries", 0)]) as channel:
        call = channel.unary_unary(
            RPCS[METHOD].full_path,
            request_serializer=rotation_pb2.PlanRotationRequest.SerializeToString,
            response_deserializer=rotation_pb2.PlanRotationResponse.FromString,
        )
        try:
            call(request, timeout=PROBE_DEADLINE_S)
        except grpc.RpcError as exc:
            return str(exc.code().name)
    return "OK"


def _collect(config: PhaseConfig, folder: Path) -> tuple[dict[str, list[int]], int, int]:
    latencies: dict[str, list[int]] = {}
    late = 0
    elapsed_ns = 0
    for i in range(config.clients):
        out = folder / f"client-{i}.json"
        if not out.exists():
            err = (folder / f"client-{i}.err").read_text(encoding="utf-8")[-1500:]
            raise LoadError(f"client {i} wrote no outcome: {err or 'nothing on stderr'}")
        outcome = json.loads(out.read_text(encoding="utf-8"))
        for code, values in outcome["latencies_ns"].items():
            latencies.setdefault(code, []).extend(values)
        late += int(outcome["late_starts"])
        elapsed_ns = max(elapsed_ns, int(outcome["elapsed_ns"]))
    return latencies, late, elapsed_ns


def run_phase(config: PhaseConfig, progress: Progress | None = None) -> PhaseResult:
    say: Progress = progress or (lambda _: None)
    request = build_request(config)
    with tempfile.TemporaryDirectory(prefix="planner-bench-service-") as tmp:
        folder = Path(tmp)
        request_file = folder / "request.bin"
        request_file.write_bytes(request.SerializeToString())
        say(f"{config.name}: planner serve ({config.limits.label})")
        with ServerProcess(
            "--store", ":memory:", "--log-level", "warning", *config.limits.serve_args()
        ) as server:
            began = time.monotonic()
            say(f"{config.name}: starting {config.clients} client processes")
            clients = _start_clients(config, server.address, folder, request_file)
            try:
                _await_ready(clients, folder)
                startup_s = time.monotonic() - began
                say(
                    f"{config.name}: all ready after {startup_s:.1f} s; calling for "
                    f"{config.duration_s:g} s"
                )
                _release(clients)
                limit_s = config.duration_s + config.deadline_ms / 1000 + FINISH_TIMEOUT_S
                rss = _watch(clients, server.pid, limit_s)
            finally:
                for proc in clients:
                    if proc.poll() is None:
                        proc.kill()
                    proc.wait()
                    for stream in (proc.stdin, proc.stdout):
                        if stream is not None:
                            stream.close()
            probe = _probe(server.address, request)
        latencies, late, elapsed_ns = _collect(config, folder)
    limit_ns = (config.deadline_ms + DEADLINE_GRACE_MS) * 1e6
    return PhaseResult(
        config=config,
        window_s=elapsed_ns / 1e9,
        codes={code: code_stats(values) for code, values in sorted(latencies.items())},
        late_starts=late,
        over_deadline=sum(v > limit_ns for values in latencies.values() for v in values),
        rss=rss,
        probe_after=probe,
        startup_s=round(startup_s, 2),
    )
