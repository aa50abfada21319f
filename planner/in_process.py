"""The in-process shim: the only part of the planner an engine adapter runs
inside the engine's own process (DESIGN.md §1). Everything else an adapter
reaches over gRPC, through planner.client, planner.rpc and planner.v1.

- :func:`service_handler`: the server's own handler table, for an adapter
  whose channel has no target (planner.adapters.common.channel runs it on a
  planner thread of its own), so a call in process is the same call a
  `planner serve` would answer.
- :class:`TokenDeposit` and :class:`DepositEvents`: layer offload's
  Token-Deposit (OrbitFlow §3.2), which paces a request's tokens on the
  engine's output path; the replay runs the same one.

import-linter's adapters contract (pyproject.toml) lets adapters import this
module and not the packages behind it.
"""

from __future__ import annotations

from collections.abc import Callable

from google.protobuf.message import Message

from planner.policies.offload.deposit import DepositEvents, TokenDeposit
from planner.rpc import Rpc
from planner.service.limits import ServiceLimits
from planner.service.methods import CallContext, handle

__all__ = ["DepositEvents", "TokenDeposit", "service_handler"]


def service_handler(deadline_s: float) -> Callable[[Rpc, Message], Message]:
    """The server's handler table with one context for the caller's life:
    OffloadService keeps each engine's controller in it between calls, as a
    server would."""
    ctx = CallContext(ServiceLimits(), deadline_s)
    return lambda rpc, request: handle(rpc, request, ctx)
