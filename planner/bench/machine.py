"""The machine a benchmark ran on: CPU, cores, versions, git commit."""

from __future__ import annotations

import os
import platform
import subprocess
from pathlib import Path
from typing import Any

import google.protobuf
import grpc
import numpy as np
from google.protobuf.internal import api_implementation

from planner._version import __version__

CPUINFO = Path("/proc/cpuinfo")
REPO_ROOT = Path(__file__).resolve().parents[2]


def cpu_model(cpuinfo: str) -> str | None:
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "model name":
            return value.strip()
    return None


def physical_cores(cpuinfo: str) -> int | None:
    """Distinct (physical id, core id) pairs; None when /proc/cpuinfo does not
    say (some VMs and non-x86 machines)."""
    cores: set[tuple[str, str]] = set()
    physical = core = None
    for line in [*cpuinfo.splitlines(), ""]:
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "physical id":
            physical = value.strip()
        elif key == "core id":
            core = value.strip()
        elif not key:
            if physical is not None and core is not None:
                cores.add((physical, core))
            physical = core = None
    return len(cores) or None


def _read_cpuinfo() -> str:
    try:
        return CPUINFO.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""


def _git(*args: str) -> str | None:
    try:
        done = subprocess.run(
            ["git", *args], cwd=REPO_ROOT, capture_output=True, text=True, timeout=10, check=True
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip()


def git_state() -> dict[str, Any]:
    """Commit of the checkout the planner runs from, and whether tracked files
    differ from it (then the numbers are not exactly that commit's)."""
    commit = _git("rev-parse", "HEAD")
    status = _git("status", "--porcelain", "--untracked-files=no") if commit else None
    return {"commit": commit, "dirty": bool(status) if status is not None else None}


def usable_cores() -> int | None:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count()


def load_average() -> float | None:
    """Other work on the machine skews timings; this says how much there was."""
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:
        return None


def machine_info() -> dict[str, Any]:
    cpuinfo = _read_cpuinfo()
    return {
        "cpu_model": cpu_model(cpuinfo) or platform.processor() or None,
        "logical_cores": os.cpu_count(),
        "physical_cores": physical_cores(cpuinfo),
        "usable_cores": usable_cores(),
        "load_avg_1m_at_start": load_average(),
        "os": platform.platform(),
        "python": f"{platform.python_implementation()} {platform.python_version()}",
        "numpy": np.__version__,
        "grpcio": grpc.__version__,
        "protobuf": f"{google.protobuf.__version__} ({api_implementation.Type()})",
        "planner": __version__,
        "git": git_state(),
    }


def describe(machine: dict[str, Any]) -> str:
    """One line for tables and markdown."""
    cores = machine.get("usable_cores") or machine.get("logical_cores")
    physical = machine.get("physical_cores")
    core_text = f"{cores} cores" + (f" ({physical} physical)" if physical else "")
    start, end = machine.get("load_avg_1m_at_start"), machine.get("load_avg_1m_at_end")
    if start is not None:
        core_text += f", 1-min load average {start:g} at start"
        core_text += f", {end:g} at end" if end is not None else ""
    return (
        f"{machine.get('cpu_model') or 'unknown CPU'}, {core_text}; {machine.get('os')}; "
        f"{machine.get('python')}, numpy {machine.get('numpy')}, "
        f"grpcio {machine.get('grpcio')}, protobuf {machine.get('protobuf')}"
    )


def describe_commit(machine: dict[str, Any]) -> str:
    git = machine.get("git") or {}
    commit = git.get("commit")
    if not commit:
        return "unknown commit"
    return str(commit)[:12] + (" + uncommitted changes" if git.get("dirty") else "")
