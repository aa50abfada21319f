"""A real `planner serve --port 0` in a subprocess, for benchmarks over gRPC
on loopback."""

from __future__ import annotations

import argparse
import re
import selectors
import signal
import subprocess
import sys
import tempfile
import time
from types import TracebackType
from typing import IO

SERVING_LINE = re.compile(r"^planner serving on (?P<address>\S+)\s*$")
START_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 15.0


class ServerStartError(RuntimeError):
    pass


def serve_command(*extra: str) -> list[str]:
    """`planner serve --port 0` run by this interpreter (the console script is
    a thin wrapper around planner.cli:main)."""
    return [sys.executable, "-m", "planner.cli", "serve", "--port", "0", *extra]


def parse_address(line: str) -> str | None:
    """HOST:PORT from the line `planner serve` prints once it listens."""
    match = SERVING_LINE.match(line)
    return match.group("address") if match else None


def add_planner_arg_option(parser: argparse.ArgumentParser) -> None:
    """--planner-arg ARG, repeatable: the extra arguments of the `planner
    serve` a benchmark starts (args.planner_arg, a list)."""
    parser.add_argument(
        "--planner-arg",
        action="append",
        default=[],
        metavar="ARG",
        help="an argument for `planner serve` (e.g. --planner-arg=--max-workers=1)",
    )


class ServerProcess:
    """Starts the server, waits for its "planner serving on HOST:PORT" line,
    and stops it with SIGTERM (waiting for it to exit) on close."""

    def __init__(
        self,
        *extra_args: str,
        start_timeout_s: float = START_TIMEOUT_S,
        new_session: bool = False,
    ) -> None:
        """new_session: the server in a session of its own (so in a
        scheduling autogroup of its own where the kernel has them)."""
        self.command = serve_command(*extra_args)
        # Closed in close(), which every path out of __init__ reaches.
        self._stderr: IO[bytes] = tempfile.TemporaryFile()  # noqa: SIM115
        self._proc = subprocess.Popen(
            self.command,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            stdin=subprocess.DEVNULL,
            start_new_session=new_session,
        )
        try:
            self.address = self._wait_for_address(start_timeout_s)
        except BaseException:
            self.close()
            raise

    @property
    def pid(self) -> int:
        return self._proc.pid

    def _wait_for_address(self, timeout_s: float) -> str:
        stdout = self._proc.stdout
        assert stdout is not None
        deadline = time.monotonic() + timeout_s
        with selectors.DefaultSelector() as selector:
            selector.register(stdout, selectors.EVENT_READ)
            while (left := deadline - time.monotonic()) > 0:
                if not selector.select(left):
                    continue
                line = stdout.readline()
                if not line:
                    raise ServerStartError(f"planner serve exited: {self._stderr_tail()}")
                address = parse_address(line.decode("utf-8", errors="replace"))
                if address is not None:
                    return address
        raise ServerStartError(
            f"planner serve printed no address within {timeout_s:.0f} s: {self._stderr_tail()}"
        )

    def _stderr_tail(self, limit: int = 2000) -> str:
        self._stderr.seek(0)
        text = self._stderr.read().decode("utf-8", errors="replace").strip()
        return text[-limit:] or "(nothing on stderr)"

    def kill(self) -> int:
        """kill -9, as a crash would; returns the exit status."""
        self._proc.kill()
        return self._proc.wait()

    def close(self) -> int | None:
        """SIGTERM, wait; SIGKILL if it does not stop in time. Returns the
        exit status."""
        if self._proc.poll() is None:
            self._proc.send_signal(signal.SIGTERM)
            try:
                self._proc.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        if self._proc.stdout is not None:
            self._proc.stdout.close()
        self._stderr.close()
        return self._proc.returncode

    def __enter__(self) -> ServerProcess:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
