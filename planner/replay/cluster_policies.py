"""The cluster replay topology's policies by name (``planner replay
--topology cluster --policy``): what each does besides the dispatcher and
queue balancing every policy has (planner.replay.cluster_engine)."""

from __future__ import annotations

from dataclasses import dataclass

from planner.registry import Registry


@dataclass(frozen=True, slots=True)
class ClusterPolicy:
    name: str
    # Fixed pipeline groups of static_group_size instances from the start
    # (else every instance is a unit of its own).
    static_groups: bool = False
    # KunServe: lone instances merge into buddy groups when a drop trigger
    # fires, and groups restore when demand falls.
    buddy_groups: bool = False
    # Llumnix: a blocked instance moves its shortest running request's KV to
    # a less loaded one.
    migrates_kv: bool = False


KUNSERVE = "kunserve"
REPLICATION = "replication"
STATIC_PP = "static-pp"
KV_MIGRATION = "kv-migration"

CLUSTER_POLICIES: Registry[ClusterPolicy] = Registry("cluster policy")


def _register(policy: ClusterPolicy, summary: str, served_by: str = "") -> None:
    CLUSTER_POLICIES.register(policy.name, policy, summary=summary, served_by=served_by)


_register(
    ClusterPolicy(KUNSERVE, buddy_groups=True),
    "KunServe: drop parameters into buddy groups on predicted KV exhaustion, restore later",
    "ClusterService.PlanBuddyGroups",
)
_register(ClusterPolicy(REPLICATION), "every instance a full replica")
_register(
    ClusterPolicy(STATIC_PP, static_groups=True),
    "fixed pipeline groups of --static-group-size instances, never restored",
)
_register(
    ClusterPolicy(KV_MIGRATION, migrates_kv=True),
    "replication plus Llumnix's live KV migration off blocked instances",
)

CLUSTER_POLICY_NAMES = CLUSTER_POLICIES.names()
