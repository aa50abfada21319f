"""The scheduling (rotation) policies of the single-engine replay by name
(``planner replay --policy``). A policy is a Scheduler (planner.replay.
schedulers) made fresh per run by the factory registered here, with where
it pages KV to (planner.replay.cfs_paging)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace

from planner.domain.rotation import RotationInputs, RotationVariant
from planner.registry import Registry
from planner.replay.cfs_paging import Paging
from planner.replay.cfs_scheduler import CFS_DRAM, CFS_PEER, Cfs, CfsKnobs
from planner.replay.schedulers import (
    Fcfs,
    FcfsVllm,
    Lvf,
    LvfAsVllmAdapter,
    Scheduler,
    SwappedFirst,
    WaitingFirst,
)


@dataclass(frozen=True, slots=True)
class SchedulerSetup:
    """What a scheduler factory may use: the rotation policy's inputs and
    AQUA's CFS knobs."""

    rotation: RotationInputs
    cfs: CfsKnobs = field(default_factory=CfsKnobs)


SchedulerFactory = Callable[[SchedulerSetup], Scheduler]


@dataclass(frozen=True, slots=True)
class SchedulingPolicy:
    make: SchedulerFactory
    paging: Paging = Paging.ENGINE


SCHEDULERS: Registry[SchedulingPolicy] = Registry("policy")
PLAN_ROTATION = "RotationService.PlanRotation"
PARTITION_BATCH = "PlacementService.PartitionBatch"


def _lvf(variant: RotationVariant, name: str) -> SchedulerFactory:
    def make(setup: SchedulerSetup) -> Scheduler:
        params = replace(setup.rotation.params, variant=variant)
        return Lvf(replace(setup.rotation, params=params), name=name)

    return make


def _cfs(name: str) -> SchedulerFactory:
    def make(setup: SchedulerSetup) -> Scheduler:
        return Cfs(name, setup.cfs)

    return make


SCHEDULERS.register(
    "fcfs",
    SchedulingPolicy(lambda _: Fcfs()),
    summary="vLLM V1: strict queue order, recompute preemption",
)
SCHEDULERS.register(
    "fcfs-vllm",
    SchedulingPolicy(lambda _: FcfsVllm()),
    summary="fcfs in vLLM V1's order: running requests take their blocks first",
)
SCHEDULERS.register(
    "lvf",
    SchedulingPolicy(_lvf(RotationVariant.LVF, "lvf")),
    summary="SuperInfer's Largest-VLT-First rotation with DuplexKV swaps",
    served_by=PLAN_ROTATION,
)
SCHEDULERS.register(
    "lvf-paper",
    SchedulingPolicy(_lvf(RotationVariant.LVF_PAPER, "lvf-paper")),
    summary="LVF as the paper's Algorithm 1 has it (B_xfer frees blocks by preemption)",
    served_by=PLAN_ROTATION,
)
SCHEDULERS.register(
    "lvf-vllm",
    SchedulingPolicy(lambda setup: LvfAsVllmAdapter(setup.rotation)),
    summary="lvf as the vLLM adapter applies it: asked only while a victim exists, "
    "its plan applied only when it preempts, vLLM's own order and recompute otherwise",
    served_by=PLAN_ROTATION,
)
SCHEDULERS.register(
    "lvf-vllm-swap",
    SchedulingPolicy(
        lambda setup: LvfAsVllmAdapter(setup.rotation, name="lvf-vllm-swap", swaps=True)
    ),
    summary="lvf-vllm with the adapter's engine_preemptions: swap "
    "(vLLM's own preemptions swapped out by the connector, not recomputed)",
    served_by=PLAN_ROTATION,
)
SCHEDULERS.register(
    "waiting-first",
    SchedulingPolicy(lambda _: WaitingFirst()),
    summary="swap running requests out for waiting ones (vLLM swap baseline)",
)
SCHEDULERS.register(
    "swapped-first",
    SchedulingPolicy(lambda _: SwappedFirst()),
    summary="resume swapped requests before admitting new ones",
)
SCHEDULERS.register(
    CFS_DRAM,
    SchedulingPolicy(_cfs(CFS_DRAM), Paging.DRAM),
    summary="AQUA's CFS time slices, paging KV to host DRAM",
    served_by=PARTITION_BATCH,
)
SCHEDULERS.register(
    CFS_PEER,
    SchedulingPolicy(_cfs(CFS_PEER), Paging.PEER),
    summary="AQUA's CFS time slices, paging KV to a peer GPU's memory over NVLink",
    served_by=PARTITION_BATCH,
)

POLICY_NAMES = SCHEDULERS.names()


def make_scheduler(name: str, inputs: RotationInputs, cfs: CfsKnobs | None = None) -> Scheduler:
    """A fresh scheduler for one run; cfs: AQUA's CFS knobs for the cfs
    policies (default CfsKnobs()). UnknownNameError names the known ones."""
    setup = SchedulerSetup(inputs, cfs if cfs is not None else CfsKnobs())
    return SCHEDULERS[name].make(setup)
