"""How much of each model's weights a slice keeps in its HBM (the rest
streams over C2C on every pass): the HBM left after the KV the slice must
keep is shared by water-filling, every model getting the same level capped
at what it may hold. A model alone on a slice that fits keeps all its
weights; several models on one slice each keep an equal part."""

from __future__ import annotations

from collections.abc import Sequence


def resident_split(caps: Sequence[float], free_bytes: float, kv_bytes: float) -> tuple[int, ...]:
    """Resident weight bytes per model, in the order of ``caps``.

    ``caps``: the most each model may keep (its weight bytes, or what it
    keeps already when it can only shrink without a copy); ``free_bytes``:
    the slice's HBM for weights and KV; ``kv_bytes``: the KV it keeps.
    The sum never exceeds ``free_bytes - kv_bytes`` (0 when negative) and
    no model gets more than its cap."""
    for i, cap in enumerate(caps):
        if not cap >= 0:
            raise ValueError(f"caps[{i}] must be >= 0, got {cap}")
    if not kv_bytes >= 0:
        raise ValueError(f"kv_bytes must be >= 0, got {kv_bytes}")
    room = max(0.0, free_bytes - kv_bytes)
    out = [0] * len(caps)
    order = sorted(range(len(caps)), key=lambda i: (caps[i], i))
    left = len(order)
    for i in order:
        level = room / left
        take = int(min(caps[i], level))
        out[i] = take
        room -= take
        left -= 1
    return tuple(out)
