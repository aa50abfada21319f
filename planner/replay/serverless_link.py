"""A link that concurrent weight loads share fairly (processor sharing):
with k transfers in flight each moves at bandwidth / k, and the shares
change whenever one starts or finishes. The serverless topology loads the
weights of the HBM-resident baselines through it, so loads that overlap
(several slices switching at once) each take longer."""

from __future__ import annotations

import math

from planner.profiles.mig import GB

# Bytes below which a transfer counts as done (float rounding of rate x time).
_DONE_BYTES = 1e3


class SharedLink:
    def __init__(self, gbps: float) -> None:
        if not (math.isfinite(gbps) and gbps > 0):
            raise ValueError(f"link bandwidth must be a finite number > 0, got {gbps}")
        self.bytes_per_s = gbps * GB
        self._left: dict[int, float] = {}
        self._t = 0.0

    def __len__(self) -> int:
        return len(self._left)

    def _advance(self, now_s: float) -> None:
        if now_s < self._t:
            raise ValueError(f"time went back: {now_s} < {self._t}")
        if self._left:
            moved = self.bytes_per_s / len(self._left) * (now_s - self._t)
            for key in self._left:
                self._left[key] -= moved
        self._t = now_s

    def start(self, key: int, nbytes: float, now_s: float) -> None:
        """A transfer of ``nbytes`` under ``key`` (not already in flight)."""
        if key in self._left:
            raise ValueError(f"transfer {key} is already in flight")
        if not (math.isfinite(nbytes) and nbytes >= 0):
            raise ValueError(f"nbytes must be a finite number >= 0, got {nbytes}")
        self._advance(now_s)
        self._left[key] = nbytes

    def cancel(self, key: int, now_s: float) -> None:
        """Drop a transfer in flight (the others speed up from now)."""
        self._advance(now_s)
        del self._left[key]

    def left_bytes(self, now_s: float) -> float:
        """Bytes the transfers in flight have left at ``now_s`` (no later
        than the next finish); the link is unchanged."""
        if not self._left:
            return 0.0
        moved = self.bytes_per_s / len(self._left) * max(0.0, now_s - self._t)
        return sum(max(0.0, left - moved) for left in self._left.values())

    def next_finish_s(self) -> float | None:
        """When the first transfer in flight finishes if none starts before."""
        if not self._left:
            return None
        least = max(0.0, min(self._left.values()))
        return self._t + least * len(self._left) / self.bytes_per_s

    def finished(self, now_s: float) -> list[int]:
        """The transfers done by ``now_s`` (removed), in key order."""
        self._advance(now_s)
        done = sorted(k for k, left in self._left.items() if left <= _DONE_BYTES)
        for key in done:
            del self._left[key]
        return done
