"""The formulation: variables, linear constraints, one-hot groups, a linear objective.

A model is written once and solved by any backend (`planner.solvers.solve`).
Storage is columnar: variables are integer ids (numpy arrays of them), and
constraints are added a row or a whole matrix at a time from arrays, so
building a model of a few hundred variables costs microseconds per row, not
per term.

Every variable has finite bounds (CP-SAT and exhaustive enumeration need
them; Gurobi is given the same). Binary and integer variables take integer
values; continuous variables are real in Gurobi and, in CP-SAT, lb plus a
multiple of their `resolution` (README.md, "Scaling").
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from .frozen import FloatArray, FrozenModel, Rows, Sense, VarIds, VarType

CONTINUOUS_STEPS = 2**20
"""A continuous variable's default CP-SAT resolution: the largest power of two
at most (ub - lb) / CONTINUOUS_STEPS."""


_SENSES = {"<=": Sense.LE, ">=": Sense.GE, "==": Sense.EQ, "=": Sense.EQ}


def _sense(sense: Sense | str) -> Sense:
    if isinstance(sense, Sense):
        return sense
    try:
        return _SENSES[sense]
    except KeyError:
        raise ValueError(f"unknown sense {sense!r}: use '<=', '>=' or '=='") from None


class Model:
    """A mixed-integer linear model with one-hot groups.

    ```
    m = Model()
    x = m.add_binaries(12).reshape(3, 4)       # 3 groups of 4 choices
    m.add_exactly_one_groups(x)                # one choice per group
    m.add_linear(x.ravel(), weights, "<=", 10)
    y = m.add_continuous(1, 0.0, 100.0)[0]
    m.add_max_lower_bound(y, loads, x.ravel(), -capacity)  # y >= loads @ x - capacity
    m.minimize(np.append(x.ravel(), y), np.append(costs, 1.0))
    ```
    """

    def __init__(self, name: str = "") -> None:
        self.name = name
        self._lb: list[FloatArray] = []
        self._ub: list[FloatArray] = []
        self._type: list[npt.NDArray[np.int8]] = []
        self._res: list[FloatArray] = []
        self._n = 0
        self._row_vars: list[npt.NDArray[np.int64]] = []
        self._row_coefs: list[FloatArray] = []
        self._row_lens: list[npt.NDArray[np.int64]] = []
        self._row_sense: list[npt.NDArray[np.int8]] = []
        self._row_rhs: list[FloatArray] = []
        self._n_rows = 0
        self._groups: list[npt.NDArray[np.int64]] = []
        self._obj_vars: npt.NDArray[np.int64] = np.zeros(0, np.int64)
        self._obj_coefs: FloatArray = np.zeros(0)
        self._obj_constant = 0.0
        self._maximize = False
        self._cache: FrozenModel | None = None

    # ---- variables -------------------------------------------------------

    def add_vars(
        self,
        count: int,
        vtype: VarType,
        lb: npt.ArrayLike = 0.0,
        ub: npt.ArrayLike = 1.0,
        resolution: npt.ArrayLike | None = None,
    ) -> VarIds:
        """`count` variables with the given bounds (scalars or arrays); returns their ids.

        `resolution` (continuous only): the CP-SAT grid step; default the
        largest power of two at most (ub - lb) / 2**20."""
        if count < 0:
            raise ValueError(f"count must be >= 0, got {count}")
        lo = np.broadcast_to(np.asarray(lb, dtype=np.float64), (count,)).copy()
        hi = np.broadcast_to(np.asarray(ub, dtype=np.float64), (count,)).copy()
        if not (np.isfinite(lo).all() and np.isfinite(hi).all()):
            raise ValueError("variable bounds must be finite")
        if (lo > hi).any():
            raise ValueError("variable lower bound above upper bound")
        if vtype is not VarType.CONTINUOUS:
            lo, hi = np.ceil(lo - 1e-9), np.floor(hi + 1e-9)
            if (lo > hi).any():
                raise ValueError("integer variable with no integer in its bounds")
            if resolution is not None:
                raise ValueError("resolution applies to continuous variables only")
            res = np.ones(count)
        elif resolution is None:
            width = np.maximum(hi - lo, 1.0 / CONTINUOUS_STEPS)
            res = np.exp2(np.floor(np.log2(width / CONTINUOUS_STEPS)))
        else:
            res = np.broadcast_to(np.asarray(resolution, dtype=np.float64), (count,)).copy()
            if not (res > 0).all():
                raise ValueError("resolution must be > 0")
        if vtype is VarType.BINARY and ((lo < 0) | (hi > 1)).any():
            raise ValueError("binary variable bounds must lie in [0, 1]")
        ids = np.arange(self._n, self._n + count, dtype=np.int64)
        self._lb.append(lo)
        self._ub.append(hi)
        self._type.append(np.full(count, int(vtype), np.int8))
        self._res.append(res)
        self._n += count
        self._cache = None
        return ids

    def add_binaries(self, count: int) -> VarIds:
        return self.add_vars(count, VarType.BINARY, 0.0, 1.0)

    def add_integers(self, count: int, lb: npt.ArrayLike, ub: npt.ArrayLike) -> VarIds:
        return self.add_vars(count, VarType.INTEGER, lb, ub)

    def add_continuous(
        self,
        count: int,
        lb: npt.ArrayLike,
        ub: npt.ArrayLike,
        resolution: npt.ArrayLike | None = None,
    ) -> VarIds:
        return self.add_vars(count, VarType.CONTINUOUS, lb, ub, resolution)

    # ---- constraints -----------------------------------------------------

    def add_linear(
        self,
        vars: npt.ArrayLike,
        coefs: npt.ArrayLike,
        sense: Sense | str,
        rhs: float,
    ) -> int:
        """One row `coefs @ x[vars] <sense> rhs`; returns its index.

        A variable listed twice has its coefficients summed."""
        v = self._check_vars(vars)
        c = np.broadcast_to(np.asarray(coefs, dtype=np.float64), v.shape)
        return int(self._append_rows(v, c, np.array([len(v)], np.int64), sense, [rhs])[0])

    def add_rows(
        self,
        matrix: npt.ArrayLike,
        vars: npt.ArrayLike,
        sense: Sense | str,
        rhs: npt.ArrayLike,
    ) -> npt.NDArray[np.int64]:
        """Rows `matrix @ x[vars] <sense> rhs` from a dense 2-D matrix (zeros
        dropped); returns their indices."""
        a = np.asarray(matrix, dtype=np.float64)
        if a.ndim != 2:
            raise ValueError(f"matrix must be 2-D, got shape {a.shape}")
        v = self._check_vars(vars)
        if a.shape[1] != len(v):
            raise ValueError(f"matrix has {a.shape[1]} columns for {len(v)} variables")
        b = np.broadcast_to(np.asarray(rhs, dtype=np.float64), (a.shape[0],))
        rows, cols = np.nonzero(a)
        lens = np.bincount(rows, minlength=a.shape[0]).astype(np.int64)
        return self._append_rows(v[cols], a[rows, cols], lens, sense, b)

    def add_exactly_one(self, vars: npt.ArrayLike) -> None:
        """Exactly one of these binaries is 1 (a one-hot choice)."""
        self.add_exactly_one_groups(np.asarray(vars, dtype=np.int64).reshape(1, -1))

    def add_exactly_one_groups(
        self, groups: npt.NDArray[np.integer] | Sequence[npt.ArrayLike]
    ) -> None:
        """One one-hot group per row of a 2-D array (or per item of a list)."""
        items: list[npt.NDArray[np.int64]]
        if isinstance(groups, np.ndarray) and groups.ndim == 2:
            items = [self._check_vars(groups).reshape(groups.shape[0], groups.shape[1])]
        else:
            items = [self._check_vars(g).reshape(1, -1) for g in groups]
        types = self._types()
        for block in items:
            if block.shape[1] == 0:
                raise ValueError("an exactly-one group must not be empty")
            ordered = np.sort(block, axis=1)
            if (ordered[:, 1:] == ordered[:, :-1]).any():
                raise ValueError("an exactly-one group lists a variable twice")
            if (types[block] != VarType.BINARY).any():
                raise ValueError("exactly-one groups take binary variables only")
        for block in items:
            self._groups.extend(block)
        self._cache = None

    def add_max_lower_bound(
        self,
        y: int | npt.ArrayLike,
        matrix: npt.ArrayLike,
        vars: npt.ArrayLike,
        constants: npt.ArrayLike = 0.0,
    ) -> npt.NDArray[np.int64]:
        """`y >= matrix[i] @ x[vars] + constants[i]` for every row i.

        With one `y`, y is at least the max of the rows; with one `y` per row,
        row-wise (e.g. stall_l >= fetch_l @ x - compute_l). Constraints only:
        y's lower bound adds `y >= lb` (0 for a `max(0, ...)` term), and a
        minimizing objective pushes y down onto the max. Returns the row indices."""
        a = np.asarray(matrix, dtype=np.float64)
        if a.ndim != 2:
            raise ValueError(f"matrix must be 2-D, got shape {a.shape}")
        n_rows = a.shape[0]
        v = self._check_vars(vars)
        if a.shape[1] != len(v):
            raise ValueError(f"matrix has {a.shape[1]} columns for {len(v)} variables")
        ys = self._check_vars(np.broadcast_to(np.asarray(y, dtype=np.int64), (n_rows,)))
        k = np.broadcast_to(np.asarray(constants, dtype=np.float64), (n_rows,))
        # y_i - matrix[i] @ x >= constants[i]; each row's entries kept contiguous.
        rows, cols = np.nonzero(a)
        entry_rows = np.concatenate([np.arange(n_rows), rows])
        order = np.argsort(entry_rows, kind="stable")
        entry_vars = np.concatenate([ys, v[cols]])[order]
        entry_coefs = np.concatenate([np.ones(n_rows), -a[rows, cols]])[order]
        lens = np.bincount(rows, minlength=n_rows).astype(np.int64) + 1
        return self._append_rows(entry_vars, entry_coefs, lens, Sense.GE, k)

    # ---- objective -------------------------------------------------------

    def minimize(self, vars: npt.ArrayLike, coefs: npt.ArrayLike, constant: float = 0.0) -> None:
        self._set_objective(vars, coefs, constant, maximize=False)

    def maximize(self, vars: npt.ArrayLike, coefs: npt.ArrayLike, constant: float = 0.0) -> None:
        self._set_objective(vars, coefs, constant, maximize=True)

    def _set_objective(
        self, vars: npt.ArrayLike, coefs: npt.ArrayLike, constant: float, *, maximize: bool
    ) -> None:
        v = self._check_vars(vars)
        c = np.broadcast_to(np.asarray(coefs, dtype=np.float64), v.shape)
        if not np.isfinite(c).all() or not math.isfinite(constant):
            raise ValueError("objective coefficients must be finite")
        self._obj_vars, self._obj_coefs = v.copy(), c.copy()
        self._obj_constant = float(constant)
        self._maximize = maximize
        self._cache = None

    # ---- reading ---------------------------------------------------------

    @property
    def num_vars(self) -> int:
        return self._n

    @property
    def maximizing(self) -> bool:
        """True after `maximize`, False after `minimize` (and by default)."""
        return self._maximize

    @property
    def num_rows(self) -> int:
        """Linear rows, one-hot groups not counted."""
        return self._n_rows

    @property
    def num_constraints(self) -> int:
        """Linear rows plus one-hot groups."""
        return self._n_rows + len(self._groups)

    @property
    def groups(self) -> list[npt.NDArray[np.int64]]:
        return list(self._groups)

    def frozen(self) -> FrozenModel:
        """The model as flat arrays, built once and cached until the model changes."""
        if self._cache is None:
            self._cache = self._freeze()
        return self._cache

    def objective_value(self, values: npt.ArrayLike) -> float:
        """The objective at a full assignment, in the model's units."""
        f = self.frozen()
        x = np.asarray(values, dtype=np.float64)
        return float(f.objective @ x) + self._obj_constant

    def max_violation(self, values: npt.ArrayLike) -> float:
        """The largest violation of any bound, integrality, row or group at a full
        assignment (0.0 when it satisfies everything exactly)."""
        return self.frozen().max_violation(np.asarray(values, dtype=np.float64))

    # ---- internals -------------------------------------------------------

    def _types(self) -> npt.NDArray[np.int8]:
        return np.concatenate(self._type) if self._type else np.zeros(0, np.int8)

    def _check_vars(self, vars: npt.ArrayLike) -> npt.NDArray[np.int64]:
        v = np.asarray(vars)
        if v.dtype.kind not in "iu":
            if v.size == 0:
                return np.zeros(0, np.int64)
            raise TypeError(f"variable ids must be integers, got dtype {v.dtype}")
        v = v.astype(np.int64, copy=False).reshape(-1)
        if v.size and (v.min() < 0 or v.max() >= self._n):
            raise IndexError(f"variable id out of range (model has {self._n} variables)")
        return v

    def _append_rows(
        self,
        vars: npt.NDArray[np.int64],
        coefs: npt.ArrayLike,
        lens: npt.NDArray[np.int64],
        sense: Sense | str,
        rhs: npt.ArrayLike,
    ) -> npt.NDArray[np.int64]:
        c = np.asarray(coefs, dtype=np.float64)
        b = np.asarray(rhs, dtype=np.float64).reshape(-1)
        if not (np.isfinite(c).all() and np.isfinite(b).all()):
            raise ValueError("constraint coefficients and right-hand sides must be finite")
        s = _sense(sense)
        self._row_vars.append(vars)
        self._row_coefs.append(c)
        self._row_lens.append(lens)
        self._row_sense.append(np.full(len(b), int(s), np.int8))
        self._row_rhs.append(b)
        first = self._n_rows
        self._n_rows += len(b)
        self._cache = None
        return np.arange(first, self._n_rows, dtype=np.int64)

    def _freeze(self) -> FrozenModel:
        def cat(parts: Sequence[np.ndarray], dtype: type) -> np.ndarray:
            return np.concatenate(parts).astype(dtype, copy=False) if parts else np.zeros(0, dtype)

        lens = cat(self._row_lens, np.int64)
        start = np.zeros(len(lens) + 1, np.int64)
        np.cumsum(lens, out=start[1:])
        rows = Rows(
            start=start,
            vars=cat(self._row_vars, np.int64),
            coefs=cat(self._row_coefs, np.float64),
            sense=cat(self._row_sense, np.int8),
            rhs=cat(self._row_rhs, np.float64),
            entry_row=np.repeat(np.arange(len(lens), dtype=np.int64), lens),
        )
        objective = np.zeros(self._n)
        np.add.at(objective, self._obj_vars, self._obj_coefs)
        return FrozenModel(
            lb=cat(self._lb, np.float64),
            ub=cat(self._ub, np.float64),
            vtype=cat(self._type, np.int8),
            resolution=cat(self._res, np.float64),
            rows=rows,
            groups=tuple(self._groups),
            objective=objective,
            objective_constant=self._obj_constant,
            maximize=self._maximize,
        )
