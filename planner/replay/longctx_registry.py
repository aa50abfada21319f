"""The KV-residency (layer offload) policies of the long-context replay by
name (``planner replay --topology long-context --policy``). Each entry is a
LongctxPolicy's ``for_run``, imported on first use."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from planner.registry import Registry

if TYPE_CHECKING:
    from planner.replay.longctx_policies import LongctxPolicy, OffloadSetup


class LongctxPolicyFactory(Protocol):
    def __call__(self, setup: OffloadSetup, *, design_tokens: int) -> LongctxPolicy: ...


LONGCTX_POLICIES: Registry[LongctxPolicyFactory] = Registry("long-context policy")

_POLICIES = "planner.replay.longctx_policies"
LONGCTX_POLICIES.register_lazy(
    "orbitflow",
    _POLICIES,
    "OrbitFlow.for_run",
    summary="OrbitFlow: adaptive re-planning of per-request resident layers, Pause-Resume, "
    "Token-Deposit",
    served_by="OffloadService.PlanLayerOffload",
)
LONGCTX_POLICIES.register_lazy(
    "deepspeed",
    _POLICIES,
    "DeepSpeed.for_run",
    summary="DeepSpeed-Inference: all KV on the host, each layer prefetched double-buffered",
)
LONGCTX_POLICIES.register_lazy(
    "flexgen",
    _POLICIES,
    "FlexGen.for_run",
    summary="FlexGen: one uniform offload pattern chosen offline for a design batch",
)
LONGCTX_POLICIES.register_lazy(
    "flexgen+",
    _POLICIES,
    "FlexGenPlus.for_run",
    summary="a uniform pattern re-chosen when the batch changes or outgrows it",
)
LONGCTX_POLICIES.register_lazy(
    "greedy",
    _POLICIES,
    "Greedy.for_run",
    summary="OrbitFlow's Dynamic Heuristic: a greedy choice every step",
)

LONGCTX_POLICY_NAMES = LONGCTX_POLICIES.names()


def make_longctx_policy(name: str, setup: OffloadSetup, *, design_tokens: int) -> LongctxPolicy:
    """A fresh policy object for one run; design_tokens: FlexGen's design
    request length (the trace's mean final length)."""
    return LONGCTX_POLICIES[name](setup, design_tokens=design_tokens)
