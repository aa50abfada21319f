"""The replay's schedulers by policy name (``planner replay --policy``)."""

from __future__ import annotations

from dataclasses import replace

from planner.domain.rotation import RotationInputs, RotationVariant
from planner.replay.cfs_scheduler import CFS_POLICY_NAMES, Cfs, CfsKnobs
from planner.replay.schedulers import Fcfs, FcfsVllm, Lvf, Scheduler, SwappedFirst, WaitingFirst

POLICY_NAMES = (
    "fcfs",
    "fcfs-vllm",
    "lvf",
    "lvf-paper",
    "waiting-first",
    "swapped-first",
    "cfs",
    "cfs-peer",
)


def make_scheduler(name: str, inputs: RotationInputs, cfs: CfsKnobs | None = None) -> Scheduler:
    """cfs: AQUA's CFS knobs for the cfs policies (default CfsKnobs())."""
    if name in CFS_POLICY_NAMES:
        return Cfs(name, cfs if cfs is not None else CfsKnobs())
    if name == "fcfs":
        return Fcfs()
    if name == "fcfs-vllm":
        return FcfsVllm()
    if name == "lvf":
        return Lvf(replace(inputs, params=replace(inputs.params, variant=RotationVariant.LVF)))
    if name == "lvf-paper":
        paper = replace(inputs.params, variant=RotationVariant.LVF_PAPER)
        return Lvf(replace(inputs, params=paper), name="lvf-paper")
    if name == "waiting-first":
        return WaitingFirst()
    if name == "swapped-first":
        return SwappedFirst()
    raise ValueError(f"unknown policy {name!r} (known: {', '.join(POLICY_NAMES)})")
