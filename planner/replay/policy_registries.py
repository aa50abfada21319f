"""Every policy registry of the replay, by topology, and the listings made
from them: ``planner replay --policy`` choices, ``planner profiles
policies``, the policies GetPlannerInfo reports (handed to the service by
whoever starts it) and the table in docs/policies.md."""

from __future__ import annotations

from typing import Any

from planner.registry import Registry
from planner.replay.cluster_policies import CLUSTER_POLICIES
from planner.replay.longctx_registry import LONGCTX_POLICIES
from planner.replay.scheduler_by_name import SCHEDULERS
from planner.replay.serverless_policies import SERVERLESS_POLICIES

ROTATION = "rotation"
LONG_CONTEXT = "long-context"
CLUSTER = "cluster"
SERVERLESS = "serverless"

TOPOLOGY_POLICIES: dict[str, Registry[Any]] = {
    ROTATION: SCHEDULERS,
    LONG_CONTEXT: LONGCTX_POLICIES,
    CLUSTER: CLUSTER_POLICIES,
    SERVERLESS: SERVERLESS_POLICIES,
}
# The kind a policy has in the service's listing ("offload/orbitflow").
SERVICE_KIND = {
    ROTATION: "rotation",
    LONG_CONTEXT: "offload",
    CLUSTER: "cluster",
    SERVERLESS: "serverless",
}


def served_policies() -> tuple[str, ...]:
    """kind/name of every registered policy an RPC plans in production, in
    registration order (GetPlannerInfo.policies)."""
    return tuple(
        f"{SERVICE_KIND[topology]}/{entry.name}"
        for topology, registry in TOPOLOGY_POLICIES.items()
        for entry in registry.entries()
        if entry.served_by
    )


def policy_table() -> str:
    """The Markdown table of docs/policies.md: every policy of every
    topology, its summary and the RPC that serves it."""
    lines = [
        "| Topology | Policy | What it does | Served by |",
        "| --- | --- | --- | --- |",
    ]
    for topology, registry in TOPOLOGY_POLICIES.items():
        for entry in registry.entries():
            served = f"`{entry.served_by}`" if entry.served_by else "replay only"
            summary = entry.summary or f"see `{entry.source.split(':')[0]}`"
            lines.append(f"| {topology} | `{entry.name}` | {summary} | {served} |")
    return "\n".join(lines) + "\n"
