"""A lower bound on the prefetch buffer from the blocks fetched, for the
branch and bound's memory bound (search.py).

The buffer is max_l F_l >= sum_l nu_l F_l for any weights nu on the simplex.
A request fetching b blocks per layer under pattern c adds
b * sum_{l in c} nu_l to that sum, at least t * (b * count_c) when
t = min_c sum_{l in c} nu_l / count_c. So buffer >= t * (blocks fetched):
uniform weights give t = 1 / (layers that can be fetched); the best nu is a
small LP over the patterns (GLOP), solved once per pattern set.
"""

from __future__ import annotations

import functools

import numpy as np
import numpy.typing as npt
from ortools.linear_solver import pywraplp

BoolArray = npt.NDArray[np.bool_]
FloatArray = npt.NDArray[np.float64]


def buffer_share(offloaded: BoolArray) -> tuple[FloatArray, float]:
    """(nu, t) for the patterns (rows of offloaded) that fetch anything."""
    fetching = offloaded[offloaded.any(axis=1)]
    key = (fetching.shape, np.packbits(fetching).tobytes())
    nu, t = _solved(key)
    return np.array(nu), t


@functools.lru_cache(maxsize=64)
def _solved(key: tuple[tuple[int, ...], bytes]) -> tuple[tuple[float, ...], float]:
    shape, packed = key
    size = int(np.prod(shape))
    patterns = np.unpackbits(np.frombuffer(packed, dtype=np.uint8))[:size].reshape(shape) > 0
    num_layers = shape[1] if len(shape) == 2 else 0
    if patterns.size == 0:
        return tuple([0.0] * num_layers), 0.0
    usable: BoolArray = np.asarray(patterns.any(axis=0), dtype=np.bool_)
    uniform = np.where(usable, 1.0 / usable.sum(), 0.0)
    uniform_t = float((patterns @ uniform / patterns.sum(axis=1)).min())
    solver = pywraplp.Solver.CreateSolver("GLOP")
    if solver is None:
        return tuple(uniform.tolist()), uniform_t
    nu = [solver.NumVar(0.0, float(usable[i]), f"nu{i}") for i in range(num_layers)]
    t = solver.NumVar(0.0, 1.0, "t")
    solver.Add(sum(nu) == 1.0)
    for row in patterns:
        layers = np.flatnonzero(row).tolist()
        solver.Add(sum(nu[i] for i in layers) >= t * len(layers))
    solver.Maximize(t)
    if solver.Solve() != pywraplp.Solver.OPTIMAL:
        return tuple(uniform.tolist()), uniform_t
    weights = np.clip(np.array([v.solution_value() for v in nu]), 0.0, None)
    weights /= max(weights.sum(), 1e-12)
    # t recomputed from the weights actually returned, so the bound is valid
    # whatever the LP's tolerances.
    share = float((patterns @ weights / patterns.sum(axis=1)).min()) * (1 - 1e-9)
    if share <= uniform_t:
        return tuple(uniform.tolist()), uniform_t
    return tuple(weights.tolist()), share
