"""What the simulator needs from profiles: an iteration's compute time and a
transfer's time. Built-in profiles provide both (planner.profiles); tests and
users can pass any object with these methods."""

from __future__ import annotations

from typing import Protocol


class IterationCost(Protocol):
    def iteration_time_s(
        self, prefill_tokens: int, decode_tokens: int, attended_context_tokens: int
    ) -> float:
        """Seconds one engine iteration computes."""
        ...


class AttentionPairsCost(Protocol):
    """An iteration cost that also charges the prefill's causal attention
    pairs (planner.profiles.IterationCostModel; the cluster topology)."""

    def iteration_time_s(
        self,
        prefill_tokens: int,
        decode_tokens: int,
        attended_context_tokens: int,
        prefill_attention_pairs: int = 0,
    ) -> float: ...


class TransferCost(Protocol):
    def transfer_time_s(self, d2h_bytes: int, h2d_bytes: int, segment_bytes: int) -> float:
        """Seconds to move d2h_bytes GPU->CPU and h2d_bytes CPU->GPU, issued
        together, in contiguous segments of segment_bytes."""
        ...
