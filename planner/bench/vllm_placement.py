"""Where a CPU vLLM server's processes and the planner server run: the
worker's OpenMP threads on fixed cores (vLLM binds them itself from
VLLM_CPU_OMP_THREADS_BIND), the engine core, the API server with the load
client, and `planner serve` each pinned to a set of cores
(sched_setaffinity on every thread, as `taskset -c` would), and the
planner server in a scheduling autogroup of its own with a raised share.

On a kernel with autogroup scheduling (CONFIG_SCHED_AUTOGROUP,
/proc/sys/kernel/sched_autogroup_enabled = 1) each session is one
scheduling entity and nice ranks threads only inside it; the autogroup's
own nice value (/proc/PID/autogroup) ranks it against the others. A
planner server started in a session of its own gets such a group. The
kernel applies autogroups only to processes in the root CPU cgroup: not in
a container's."""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from pathlib import Path

from planner.bench.core_pinning import pin_process, process_group

# vLLM 0.32's process titles (setproctitle) for the engine core and its worker.
ENGINE_CORE_TITLE = "VLLM::EngineCor"
WORKER_TITLE = "VLLM::Worker"


def parse_cpus(text: str) -> frozenset[int]:
    """ "0", "0,1", "0-3" or "0-1,3" (the cpu-list format taskset takes)."""
    cpus: set[int] = set()
    for item in text.split(","):
        if not item.strip():
            continue
        first, _, last = item.strip().partition("-")
        try:
            low = int(first)
            high = int(last) if last else low
        except ValueError:
            raise ValueError(f"not a CPU list: {text!r}") from None
        if low < 0 or high < low:
            raise ValueError(f"not a CPU list: {text!r}")
        cpus.update(range(low, high + 1))
    if not cpus:
        raise ValueError(f"not a CPU list: {text!r}")
    return frozenset(cpus)


def cpu_list(cpus: frozenset[int]) -> str:
    return ",".join(str(c) for c in sorted(cpus))


@dataclass(frozen=True, slots=True)
class Placement:
    """None for a part: left where the kernel puts it."""

    worker: frozenset[int] | None = None
    engine_core: frozenset[int] | None = None
    # vLLM's API server and the load client.
    frontend: frozenset[int] | None = None
    planner: frozenset[int] | None = None
    # The planner server's autogroup nice value (-20..19); None: the planner
    # stays in the caller's session and autogroup.
    planner_autogroup_nice: int | None = None
    # The nice value of every thread of the planner server (-20..19), inside
    # whatever autogroup it is in; None: left as it starts.
    planner_nice: int | None = None

    def __post_init__(self) -> None:
        for name in ("planner_autogroup_nice", "planner_nice"):
            nice = getattr(self, name)
            if nice is not None and not -20 <= nice <= 19:
                raise ValueError(f"{name} must be in -20..19, got {nice}")

    @property
    def pins_anything(self) -> bool:
        return any(
            p is not None for p in (self.worker, self.engine_core, self.frontend, self.planner)
        )

    def vllm_env(self) -> dict[str, str]:
        """The worker's OpenMP threads: one per core of `worker`, bound by
        vLLM itself."""
        if self.worker is None:
            return {}
        return {
            "VLLM_CPU_OMP_THREADS_BIND": cpu_list(self.worker),
            "OMP_NUM_THREADS": str(len(self.worker)),
        }

    def describe(self) -> str:
        parts = []
        for name, cpus in (
            ("worker", self.worker),
            ("engine core", self.engine_core),
            ("API server and client", self.frontend),
            ("planner", self.planner),
        ):
            if cpus is not None:
                parts.append(f"{name} on CPU {cpu_list(cpus)}")
        if self.planner_autogroup_nice is not None:
            parts.append(f"planner in its own autogroup at nice {self.planner_autogroup_nice}")
        if self.planner_nice is not None:
            parts.append(f"planner's threads at nice {self.planner_nice}")
        return ", ".join(parts) or "no placement"


def process_title(pid: int) -> str:
    with contextlib.suppress(OSError):
        return Path(f"/proc/{pid}/comm").read_text(encoding="utf-8").strip()
    return ""


def place_vllm(server_pid: int, placement: Placement) -> dict[str, list[int]]:
    """Pins the processes of the server's process group: the API server
    (server_pid) and any helper to `frontend`, the engine core and the
    worker to theirs. Returns the pids by part."""
    found: dict[str, list[int]] = {"api": [], "engine_core": [], "worker": [], "other": []}
    for pid in process_group(server_pid):
        title = process_title(pid)
        if pid == server_pid:
            part, cpus = "api", placement.frontend
        elif title == ENGINE_CORE_TITLE:
            part, cpus = "engine_core", placement.engine_core
        elif title == WORKER_TITLE:
            part, cpus = "worker", placement.worker
        else:
            part, cpus = "other", placement.frontend
        found[part].append(pid)
        if cpus is not None:
            pin_process(pid, cpus)
    return found


def set_autogroup_nice(pid: int, nice: int) -> None:
    """The nice value of the autogroup pid belongs to (every process of its
    session)."""
    Path(f"/proc/{pid}/autogroup").write_text(f"{nice}\n", encoding="utf-8")


def autogroup_of(pid: int) -> str:
    """'/autogroup-N nice K' as the kernel reports it ('' without autogroups)."""
    with contextlib.suppress(OSError):
        return Path(f"/proc/{pid}/autogroup").read_text(encoding="utf-8").strip()
    return ""


def autogroups_in_effect() -> bool:
    """Whether an autogroup's nice value would rank this process's group:
    autogroup scheduling is on, this process is in an autogroup (it reads
    empty for one whose session never had its own, as in a container whose
    processes never called setsid), and it is in the root CPU cgroup (the
    kernel applies autogroups only there)."""
    with contextlib.suppress(OSError, ValueError):
        enabled = Path("/proc/sys/kernel/sched_autogroup_enabled").read_text(encoding="utf-8")
        if int(enabled) != 1:
            return False
        return autogroup_of(os.getpid()) != "" and _in_root_cpu_cgroup()
    return False


def _in_root_cpu_cgroup() -> bool:
    """From /proc/self/cgroup: the cgroup v1 hierarchy holding the cpu
    controller, or the v2 hierarchy where there is no v1 cpu one."""
    unified = "/"
    for line in Path("/proc/self/cgroup").read_text(encoding="utf-8").splitlines():
        _, controllers, path = line.split(":", 2)
        if "cpu" in controllers.split(","):
            return path == "/"
        if controllers == "":
            unified = path
    return unified == "/"


def place_planner(pid: int, placement: Placement) -> None:
    if placement.planner is not None:
        pin_process(pid, placement.planner)
    if placement.planner_autogroup_nice is not None:
        set_autogroup_nice(pid, placement.planner_autogroup_nice)
    if placement.planner_nice is not None:
        set_thread_nice(pid, placement.planner_nice)


def set_thread_nice(pid: int, nice: int) -> None:
    """The nice value of every thread of process pid (threads it starts
    later inherit their creator's)."""
    for tid in os.listdir(f"/proc/{pid}/task"):
        with contextlib.suppress(ProcessLookupError):
            os.setpriority(os.PRIO_PROCESS, int(tid), nice)


def affinity(pid: int) -> frozenset[int]:
    return frozenset(os.sched_getaffinity(pid))
