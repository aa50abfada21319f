"""Pure reorderings that turn a rotation plan into SGLang's own lists.

Every function returns a permutation (or subset) of positions it was given,
so applying a plan can reorder or choose among SGLang's requests but never
drop or invent one."""

from __future__ import annotations

from collections.abc import Sequence


def retraction_order(
    keep_order: Sequence[int], rids: Sequence[str], victims: Sequence[str]
) -> list[int]:
    """SGLang's ``_get_decode_retraction_order`` returns batch indices from
    most to least worth keeping and retracts by popping from the end. Put the
    planner's victims last, its first victim at the very end so it goes
    first; the others keep SGLang's relative order in front of them."""
    position = {rid: i for i, rid in enumerate(victims)}
    kept = [i for i in keep_order if rids[i] not in position]
    doomed = sorted(
        (i for i in keep_order if rids[i] in position), key=lambda i: -position[rids[i]]
    )
    return kept + doomed


def waiting_order(rids: Sequence[str], prioritized: Sequence[str]) -> list[int]:
    """Queue positions with the planner's prioritized requests first, in the
    planner's order, then everyone else in the order SGLang had them."""
    position = {rid: i for i, rid in enumerate(prioritized)}
    first = sorted(
        (i for i, rid in enumerate(rids) if rid in position), key=lambda i: position[rids[i]]
    )
    rest = [i for i, rid in enumerate(rids) if rid not in position]
    return first + rest


def planned_retractions(
    rids: Sequence[str], victims: Sequence[str], keep_at_least: int = 1
) -> list[int]:
    """Batch positions of the planner's victims, in the planner's order,
    leaving at least ``keep_at_least`` requests in the batch (SGLang's own
    retraction never empties the decode batch)."""
    present = {rid: i for i, rid in enumerate(rids)}
    chosen = [present[rid] for rid in dict.fromkeys(victims) if rid in present]
    room = max(len(rids) - keep_at_least, 0)
    return chosen[:room]
