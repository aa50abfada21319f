"""Random instances shaped like the layer-offload ILP (DESIGN.md §3.2), for
tests and the solver benchmark.

`groups` items each pick one of `choices` options (one-hot). Option c of item g
loads row l (a layer) with w_g * pattern[c, l], pattern[c] marking every k-th
row for the k giving distinct counts (option 0: none), so an item's load on
the budget is w_g * (rows - count_c). Constraints: budget
sum(w_g * kept) + buffer <= B with buffer >= each row's load (a max); a
penalty p_l >= load_l / rate - capacity_l, p_l >= 0 per row (continuous).
Objective: minimize sum(p_l).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from .frozen import VarIds
from .model import Model


@dataclass(frozen=True)
class OneHotEnvelope:
    model: Model
    x: npt.NDArray[np.int64]
    """(groups, choices) binary ids."""
    penalty: VarIds
    buffer: int
    start: tuple[npt.NDArray[np.int64], npt.NDArray[np.float64]]
    """A feasible warm start for `x` (every item on its heaviest option)."""


def option_patterns(rows: int, choices: int | None = None) -> npt.NDArray[np.bool_]:
    """(choices, rows): option 0 marks nothing; then every k-th row (1-indexed)
    for each k giving a new count, floor(rows / k); then shifted copies when
    more options are asked for."""
    layer = np.arange(1, rows + 1)
    patterns = [np.zeros(rows, bool)]
    counts: set[int] = set()
    for k in range(2, rows + 1):
        if rows // k not in counts:
            counts.add(rows // k)
            patterns.append(layer % k == 0)
    for shift in range(1, rows):
        for k in range(2, rows + 1):
            if choices is None or len(patterns) >= choices:
                break
            pat = (layer + shift) % k == 0
            if pat.any() and not any((pat == q).all() for q in patterns):
                patterns.append(pat)
    return np.array(patterns[:choices] if choices else patterns)


def one_hot_envelope_model(
    groups: int,
    rows: int,
    choices: int | None = None,
    *,
    seed: int = 0,
    budget_fraction: float = 0.7,
) -> OneHotEnvelope:
    rng = np.random.default_rng(seed)
    pattern = option_patterns(rows, choices).astype(np.float64)
    n_choices = len(pattern)
    weight = rng.integers(8, 256, groups).astype(np.float64)  # blocks per layer
    rate = 400_000.0  # blocks per second
    capacity = rng.uniform(1.0, 3.0, rows) * weight.sum() / rate / 4  # seconds
    m = Model(name=f"one-hot-envelope-{groups}x{n_choices}x{rows}")
    x = m.add_binaries(groups * n_choices).reshape(groups, n_choices)
    m.add_exactly_one_groups(x)
    # load[l] = sum_{g,c} w_g pattern[c, l] x[g, c]
    load = (weight[:, None, None] * pattern[None, :, :]).reshape(groups * n_choices, rows).T
    kept = (weight[:, None] * (rows - pattern.sum(axis=1))[None, :]).reshape(-1)
    max_load = float(load.sum(axis=1).max())
    buffer = int(m.add_continuous(1, 0.0, max_load)[0])
    m.add_max_lower_bound(buffer, load, x.ravel())
    budget = budget_fraction * weight.sum() * rows
    m.add_linear(np.append(x.ravel(), buffer), np.append(kept, 1.0), "<=", budget)
    penalty = m.add_continuous(rows, 0.0, float(weight.sum()) / rate)
    m.add_max_lower_bound(penalty, load / rate, x.ravel(), -capacity)
    m.minimize(penalty, 1.0)
    heaviest = int(np.argmax(pattern.sum(axis=1)))
    start_values = np.zeros((groups, n_choices))
    start_values[:, heaviest] = 1.0
    return OneHotEnvelope(
        model=m, x=x, penalty=penalty, buffer=buffer, start=(x.ravel(), start_values.ravel())
    )
