"""The per-iteration link budget of the rotation policy: how many KV blocks
the CPU-GPU link can move while the iteration computes (DESIGN.md §3.1).

Derived from the link curve at the size the copies are made (one block: a
contiguous region of a block-first cache) times the previous iteration's
compute time, the window the copies overlap. On a full-duplex link each
direction has its own budget, at its rate with both directions busy; on a
half-duplex link one budget holds both directions, at the slower rate. A
given budget (RotationParams.transfer_budget_blocks) overrides the
derivation: per direction on a full-duplex link, both together otherwise.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from planner.domain.rotation import PAPER_TRANSFER_BUDGET_BLOCKS, BudgetSource, RotationInputs
from planner.profiles.link import GB


@dataclass(frozen=True, slots=True)
class LinkBudget:
    """Blocks one iteration may copy in (H2D) and out (D2H); shared: one
    budget of h2d_blocks holds both directions together."""

    h2d_blocks: int
    d2h_blocks: int
    shared: bool
    source: BudgetSource

    @property
    def blocks(self) -> int:
        """The one number a plan reports (B_xfer): the H2D budget."""
        return self.h2d_blocks


@dataclass(slots=True)
class LinkUse:
    """What a plan has charged to a LinkBudget so far."""

    budget: LinkBudget
    h2d_blocks: int = 0
    d2h_blocks: int = 0

    def fits(self, h2d: int, d2h: int) -> bool:
        b = self.budget
        if b.shared:
            return self.h2d_blocks + self.d2h_blocks + h2d + d2h <= b.h2d_blocks
        return self.h2d_blocks + h2d <= b.h2d_blocks and self.d2h_blocks + d2h <= b.d2h_blocks

    def fits_swap_in(self, h2d: int, d2h: int = 0) -> bool:
        """Whether a swap-in of h2d blocks (with d2h blocks copied out to make
        room for it) fits what is left. The first swap-in of an iteration
        always fits the H2D side: one request larger than the whole budget
        would never fit otherwise, so it may take the link alone and stall
        the iteration."""
        if self.fits(h2d, d2h):
            return True
        first = self.h2d_blocks == 0 and (not self.budget.shared or self.d2h_blocks == 0)
        return first and self.fits(0, d2h)

    def swap_ins_fit(self, h2d: npt.NDArray[np.int64]) -> npt.NDArray[np.bool_]:
        """fits_swap_in(b) for each b of h2d, with nothing copied out."""
        b = self.budget
        if self.h2d_blocks == 0 and (not b.shared or self.d2h_blocks == 0):
            return np.ones(len(h2d), dtype=np.bool_)
        used = self.h2d_blocks + (self.d2h_blocks if b.shared else 0)
        fit: npt.NDArray[np.bool_] = used + h2d <= b.h2d_blocks
        return fit

    def charge(self, h2d: int, d2h: int) -> None:
        self.h2d_blocks += h2d
        self.d2h_blocks += d2h

    def d2h_left(self) -> int:
        b = self.budget
        if b.shared:
            return max(b.h2d_blocks - self.h2d_blocks - self.d2h_blocks, 0)
        return max(b.d2h_blocks - self.d2h_blocks, 0)


def link_budget(
    last_iteration_s: float | None, block_size_tokens: int, inputs: RotationInputs
) -> LinkBudget:
    """The budget of one iteration (see the module docstring). Without a
    window or a profile to derive it from: the paper's 2400 blocks each way."""
    hardware = inputs.hardware
    duplex = hardware.link_model().full_duplex if hardware is not None else True
    given = inputs.params.transfer_budget_blocks
    if given is not None:
        return LinkBudget(given, given, not duplex, BudgetSource.GIVEN)
    if inputs.model is None or hardware is None or last_iteration_s is None:
        return LinkBudget(
            PAPER_TRANSFER_BUDGET_BLOCKS,
            PAPER_TRANSFER_BUDGET_BLOCKS,
            not duplex,
            BudgetSource.DEFAULT,
        )
    h2d_per_s, d2h_per_s, shared = _block_rates(inputs, block_size_tokens)
    return LinkBudget(
        math.floor(h2d_per_s * last_iteration_s),
        math.floor(d2h_per_s * last_iteration_s),
        shared,
        BudgetSource.DERIVED,
    )


# The last inputs' block rates (a replay asks with the same inputs every
# iteration): one entry, so it holds on to one inputs at most.
_last_rates: list[tuple[RotationInputs, int, tuple[float, float, bool]]] = []


def _block_rates(inputs: RotationInputs, block_size_tokens: int) -> tuple[float, float, bool]:
    """Blocks per second each way, and whether the directions share them."""
    for last in _last_rates:
        if last[0] is inputs and last[1] == block_size_tokens:
            return last[2]
    assert inputs.model is not None and inputs.hardware is not None
    block_bytes = inputs.model.block_bytes(block_size_tokens)
    link = inputs.hardware.link_model()
    if link.full_duplex:
        h2d, d2h = link.concurrent_gbps(block_bytes, block_bytes)
        rates = (h2d * GB / block_bytes, d2h * GB / block_bytes, False)
    else:
        slower = min(link.gbps(block_bytes, "h2d"), link.gbps(block_bytes, "d2h"))
        rates = (slower * GB / block_bytes, slower * GB / block_bytes, True)
    _last_rates[:] = [(inputs, block_size_tokens, rates)]
    return rates
