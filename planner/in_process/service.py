"""The server's handler table, called in the engine's process."""

from __future__ import annotations

from collections.abc import Callable

from google.protobuf.message import Message

from planner.replay.policy_registries import served_policies
from planner.rpc import Rpc
from planner.service.limits import ServiceLimits
from planner.service.methods import CallContext, handle


def service_handler(deadline_s: float) -> Callable[[Rpc, Message], Message]:
    """The handler table with one context for the caller's life:
    OffloadService keeps each engine's controller in it between calls, as a
    server would."""
    ctx = CallContext(ServiceLimits(), deadline_s, policies=served_policies())
    return lambda rpc, request: handle(rpc, request, ctx)
