"""Engine affinity across planner replicas: the RPCs whose server keeps
per-engine state in memory (OffloadService's adaptive controllers, by
engine id; ServerlessService's rho tuners, by GPU id) must reach the same
replica call after call, while every other RPC may go to any replica.

A client picks that replica by rendezvous hashing (highest random weight)
of the key over the replicas' addresses: every client with the same
replica list picks the same one, and when a replica goes away only its own
engines move, each to its next choice, spread over the others."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

from google.protobuf.message import Message

from planner.rpc import Rpc

# Service.Method -> the request field that names the state's owner (an empty
# value: the call keeps no state, any replica answers it).
AFFINITY_FIELDS: dict[str, str] = {
    "OffloadService.PlanLayerOffload": "engine_id",
    "OffloadService.ReportStep": "engine_id",
    "ServerlessService.ChooseKernel": "gpu_id",
    "ServerlessService.ReportKnobFeedback": "gpu_id",
    "ServerlessService.GetKnobState": "gpu_id",
}


def affinity_key(rpc: Rpc, request: Message) -> str | None:
    """The key whose replica must answer this call, or None (any replica)."""
    name = AFFINITY_FIELDS.get(rpc.short_name)
    if name is None:
        return None
    value = getattr(request, name)
    return f"{rpc.service}/{value}" if value else None


def _weight(address: str, key: str) -> int:
    digest = hashlib.blake2b(f"{address}\0{key}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def rendezvous_order(key: str, addresses: Sequence[str]) -> list[str]:
    """The addresses in the order this key prefers them (first: its replica;
    then where it goes when that one is down); ties by address."""
    return sorted(addresses, key=lambda a: (-_weight(a, key), a))
