"""Token-Deposit (planner.policies.offload.deposit) for an engine's output
path."""

from planner.policies.offload.deposit import DepositEvents, TokenDeposit

__all__ = ["DepositEvents", "TokenDeposit"]
