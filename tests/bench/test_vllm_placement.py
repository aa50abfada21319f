"""Placing a CPU vLLM server's processes and the planner server: CPU lists,
the worker's OpenMP binding, pinning a real process group by process title,
and a planner server in an autogroup of its own."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from planner.bench.server_process import ServerProcess
from planner.bench.vllm_placement import (
    ENGINE_CORE_TITLE,
    WORKER_TITLE,
    Placement,
    affinity,
    autogroup_of,
    autogroups_in_effect,
    parse_cpus,
    place_planner,
    place_vllm,
    set_thread_nice,
)

TWO_CPUS = pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs")


def test_cpu_lists_read_as_taskset_writes_them():
    assert parse_cpus("0") == {0}
    assert parse_cpus("0,2") == {0, 2}
    assert parse_cpus("0-3") == {0, 1, 2, 3}
    assert parse_cpus("0-1, 3") == {0, 1, 3}
    for bad in ("", "a", "3-1", "-1", ","):
        with pytest.raises(ValueError, match="CPU list"):
            parse_cpus(bad)


def test_the_worker_gets_one_bound_openmp_thread_per_core():
    assert Placement().vllm_env() == {}
    assert Placement(worker=frozenset({0, 2})).vllm_env() == {
        "VLLM_CPU_OMP_THREADS_BIND": "0,2",
        "OMP_NUM_THREADS": "2",
    }
    assert not Placement().pins_anything
    assert Placement(planner=frozenset({1})).pins_anything
    assert Placement(worker=frozenset({0}), planner_autogroup_nice=-5).describe() == (
        "worker on CPU 0, planner in its own autogroup at nice -5"
    )
    with pytest.raises(ValueError, match="planner_autogroup_nice"):
        Placement(planner_autogroup_nice=-21)


# A process group like vLLM's: the leader (the API server) starts children
# that name themselves as vLLM's engine core and worker do, and one helper.
GROUP = """
import subprocess, sys
def child(title):
    code = (
        f"open('/proc/self/comm', 'w').write({title!r}); print(flush=True); "
        "import sys; sys.stdin.read()"
    )
    return subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
kids = [child(t) for t in sys.argv[1:]]
for k in kids:
    k.stdout.readline()
print(" ".join(str(k.pid) for k in kids), flush=True)
sys.stdin.read()
for k in kids:
    k.stdin.close(); k.wait()
"""


@TWO_CPUS
def test_each_process_of_a_vllm_group_goes_to_its_part_by_title():
    cpus = sorted(os.sched_getaffinity(0))
    a, b = frozenset(cpus[:1]), frozenset(cpus[1:2])
    leader = subprocess.Popen(
        [sys.executable, "-c", GROUP, ENGINE_CORE_TITLE, WORKER_TITLE, "helper"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        process_group=0,
    )
    try:
        assert leader.stdout is not None
        engine, worker, helper = map(int, leader.stdout.readline().split())
        found = place_vllm(leader.pid, Placement(worker=a, engine_core=b, frontend=a))
        assert found == {
            "api": [leader.pid],
            "engine_core": [engine],
            "worker": [worker],
            "other": [helper],
        }
        assert affinity(worker) == a
        assert affinity(engine) == b
        assert affinity(leader.pid) == a
        assert affinity(helper) == a
    finally:
        assert leader.stdin is not None
        leader.stdin.close()
        leader.wait(30)


@pytest.mark.skipif(
    not autogroups_in_effect(), reason="no scheduling autogroups here (kernel or cgroup)"
)
@TWO_CPUS
def test_the_planner_server_runs_in_an_autogroup_of_its_own_on_its_core():
    cpus = sorted(os.sched_getaffinity(0))
    mine = autogroup_of(os.getpid()).split()[0]
    with ServerProcess("--store", ":memory:", new_session=True) as server:
        # Raising a group's nice needs no privilege; lowering it would.
        place_planner(server.pid, Placement(planner=frozenset(cpus[1:2]), planner_autogroup_nice=3))
        group = autogroup_of(server.pid)
        assert group.split()[0] != mine
        assert group.endswith("nice 3")
        assert affinity(server.pid) == frozenset(cpus[1:2])
        assert all(
            os.sched_getaffinity(int(t.name)) == {cpus[1]}
            for t in Path(f"/proc/{server.pid}/task").iterdir()
        )
    # The caller's own group is untouched.
    assert autogroup_of(os.getpid()).split()[0] == mine


def test_every_thread_of_the_planner_gets_the_nice_value():
    # A child with a second thread; a positive nice needs no privilege.
    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import threading, sys; t = threading.Thread(target=sys.stdin.read); t.start(); "
            "print('ready', flush=True); t.join()",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None and child.stdout.readline() == "ready\n"
        set_thread_nice(child.pid, 7)
        tids = [int(t) for t in os.listdir(f"/proc/{child.pid}/task")]
        assert len(tids) >= 2
        assert {os.getpriority(os.PRIO_PROCESS, t) for t in tids} == {7}
    finally:
        assert child.stdin is not None
        child.stdin.close()
        child.wait(timeout=30)


def test_nice_values_out_of_range_are_refused():
    with pytest.raises(ValueError, match="planner_nice"):
        Placement(planner_nice=-21)
