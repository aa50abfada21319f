"""Engine and front end on separate cores: which cores vLLM's worker took,
the split, and pinning real processes (a child of this test, this process)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from planner.bench.core_pinning import (
    CoreSplit,
    pin_server,
    pinned_here,
    process_group,
    split_for,
    worker_cores,
)

LOG = (
    "(EngineCore pid=9856) INFO 11-26 01:11:14 [ompmultiprocessing.py:185] "
    "\tlocal_rank=0, core ids=[0, 2]\n"
    "(EngineCore pid=9856) INFO 11-26 01:11:14 [ompmultiprocessing.py:185] "
    "\treserved_cpus=[1]\n"
)


def test_the_workers_cores_come_from_vllms_log():
    assert worker_cores(LOG) == frozenset({0, 2})
    assert worker_cores("no binding here") == frozenset()
    assert worker_cores("local_rank=0, core ids=[]") == frozenset()


def test_the_front_end_gets_the_cores_the_worker_does_not_use():
    mine = frozenset(os.sched_getaffinity(0))
    first = min(mine)
    split = split_for(f"local_rank=0, core ids=[{first}]")
    if len(mine) == 1:
        assert split is None
        return
    assert split == CoreSplit(frozenset({first}), mine - {first})
    assert split.describe().startswith(f"engine core and worker on CPU {first},")
    assert split_for("nothing") is None


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs")
def test_a_server_group_is_split_and_this_process_pinned_and_restored():
    cpus = sorted(os.sched_getaffinity(0))
    split = CoreSplit(frozenset(cpus[:1]), frozenset(cpus[1:]))
    # A leader with one child in its own process group, as vLLM's API
    # server with its engine processes.
    leader = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import subprocess, sys; "
            "c = subprocess.Popen([sys.executable, '-c', 'import sys; sys.stdin.read()'], "
            "stdin=subprocess.PIPE); print(c.pid, flush=True); sys.stdin.read()",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        assert leader.stdout is not None
        child = int(leader.stdout.readline())
        assert process_group(leader.pid) == sorted([leader.pid, child])
        pin_server(leader.pid, split)
        assert frozenset(os.sched_getaffinity(leader.pid)) == split.frontend
        assert frozenset(os.sched_getaffinity(child)) == split.engine
    finally:
        assert leader.stdin is not None
        leader.stdin.close()
        leader.wait(10)
    before = frozenset(os.sched_getaffinity(0))
    with pinned_here(split.frontend):
        assert frozenset(os.sched_getaffinity(0)) == split.frontend
    assert frozenset(os.sched_getaffinity(0)) == before
    with pinned_here(None):
        assert frozenset(os.sched_getaffinity(0)) == before
