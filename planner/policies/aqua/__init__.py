"""AQUA producer/consumer GPU memory sharing (DESIGN.md §3.4): roles from
profiles, the placer (a planner.solvers formulation), per-server stable
matching, the lease ledger's state machine, and CFS batch partitioning."""

from planner.policies.aqua.cfs import partition_batch, should_reschedule
from planner.policies.aqua.ledger import Ledger, LedgerConflictError
from planner.policies.aqua.matching import blocking_pairs, match_server
from planner.policies.aqua.placer import evaluate, greedy_placement, place_models
from planner.policies.aqua.roles import classify, sustainable_rate

__all__ = [
    "Ledger",
    "LedgerConflictError",
    "blocking_pairs",
    "classify",
    "evaluate",
    "greedy_placement",
    "match_server",
    "partition_batch",
    "place_models",
    "should_reschedule",
    "sustainable_rate",
]
