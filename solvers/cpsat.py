"""OR-Tools CP-SAT backend: the model straight into a CpModelProto.

Writing the proto directly (no per-term Python expression objects) keeps
translation near 1 us per row for rows built from arrays. Binary and integer
variables map one to one; a continuous variable y becomes an integer k with
y = lb + resolution * k; float coefficients become integers by power-of-two
scaling (scaling.py; README.md "Scaling"). The objective keeps its scale in the
proto (`scaling_factor`, `offset`), so CP-SAT's objective and bound come back
in the model's units.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt
from ortools.sat import cp_model_pb2
from ortools.sat.python import cp_model

from .frozen import FloatArray, FrozenModel, Sense, VarType
from .model import Model
from .options import SolveOptions
from .outcome import Outcome
from .result import Status
from .scaling import scale_bounds, scale_rows, scale_vector

_STATUS: dict[Any, Status] = {
    cp_model.OPTIMAL: Status.OPTIMAL,
    cp_model.FEASIBLE: Status.FEASIBLE,
    cp_model.INFEASIBLE: Status.INFEASIBLE,
    cp_model.MODEL_INVALID: Status.MODEL_INVALID,
    cp_model.UNKNOWN: Status.TIMEOUT_NO_SOLUTION,
}


class _Translation:
    """The integer model CP-SAT sees, and the map back to the model's values."""

    def __init__(self, f: FrozenModel, bits: int) -> None:
        cont = f.vtype == VarType.CONTINUOUS
        # y = offset + step * k ; discrete: offset 0, step 1.
        self.offset = np.where(cont, f.lb, 0.0)
        self.step = np.where(cont, f.resolution, 1.0)
        self.lo = np.where(cont, 0.0, f.lb).astype(np.int64)
        self.hi = np.where(cont, np.floor((f.ub - f.lb) / f.resolution + 1e-9), f.ub).astype(
            np.int64
        )
        max_abs = np.maximum(np.abs(self.lo), np.abs(self.hi)).astype(np.float64)
        r = f.rows
        coefs = r.coefs * self.step[r.vars]
        shifted = f.rows.rhs - np.bincount(
            r.entry_row, weights=r.coefs * self.offset[r.vars], minlength=r.count
        )
        scaled = scale_rows(coefs, r.start, r.entry_row, max_abs[r.vars], bits)
        self.row_coefs = scaled.coefs
        lower = scale_bounds(shifted, scaled.exponent, scaled.slack, upper=False)
        upper = scale_bounds(shifted, scaled.exponent, scaled.slack, upper=True)
        self.row_lo = np.where(r.sense == Sense.LE, np.iinfo(np.int64).min, lower)
        self.row_hi = np.where(r.sense == Sense.GE, np.iinfo(np.int64).max, upper)
        self.empty_row = (self.row_lo > self.row_hi) & (r.sense == Sense.EQ)
        obj = f.objective * self.step
        self.obj_vars = np.flatnonzero(obj).astype(np.int64)
        self.obj_coefs, exponent, _ = scale_vector(obj[self.obj_vars], max_abs[self.obj_vars], bits)
        self.obj_scale = float(np.ldexp(1.0, exponent))
        self.obj_offset = f.objective_constant + float(f.objective @ self.offset)

    def values(self, solution: list[int]) -> FloatArray:
        out: FloatArray = self.offset + self.step * np.asarray(solution, dtype=np.float64)
        return out

    def hint(self, values: FloatArray, known: npt.NDArray[np.int64]) -> list[int]:
        """The integer values of a warm start's known variables (rounded to the grid)."""
        k = np.rint((values[known] - self.offset[known]) / self.step[known])
        out: list[int] = np.clip(k, self.lo[known], self.hi[known]).astype(np.int64).tolist()
        return out


def _varint(value: int) -> bytes:
    """Protobuf base-128 varint of an int64 (negative: two's complement)."""
    value &= (1 << 64) - 1
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


_VARIABLES_FIELD = cp_model_pb2.CpModelProto.DESCRIPTOR.fields_by_name["variables"].number
_DOMAIN_FIELD = cp_model_pb2.IntegerVariableProto.DESCRIPTOR.fields_by_name["domain"].number
_LEN = 2  # wire type: length-delimited


def _variables_wire(lo: list[int], hi: list[int]) -> bytes:
    """`CpModelProto.variables` in wire format (one domain [lo, hi] each), parsed
    in C in one call: a few hundred variables cost microseconds, not one
    message object each."""
    cache: dict[tuple[int, int], bytes] = {}
    pieces = []
    for pair in zip(lo, hi, strict=True):
        piece = cache.get(pair)
        if piece is None:
            domain = _varint(pair[0]) + _varint(pair[1])
            inner = _varint(_DOMAIN_FIELD << 3 | _LEN) + _varint(len(domain)) + domain
            piece = _varint(_VARIABLES_FIELD << 3 | _LEN) + _varint(len(inner)) + inner
            cache[pair] = piece
        pieces.append(piece)
    return b"".join(pieces)


def build_proto(
    model: Model, options: SolveOptions, hint: FloatArray | None
) -> tuple[cp_model.CpModel, _Translation]:
    f = model.frozen()
    t = _Translation(f, options.coefficient_bits)
    m = cp_model.CpModel()
    p = m.proto
    p.name = model.name
    if hasattr(p, "MergeFromString"):  # a Python protobuf message (OR-Tools < 9.15)
        p.MergeFromString(_variables_wire(t.lo.tolist(), t.hi.tolist()))
    else:  # OR-Tools 9.15+: the C++ proto behind pybind11
        add_var = p.variables.add
        for lo, hi in zip(t.lo.tolist(), t.hi.tolist(), strict=True):
            add_var().domain.extend((lo, hi))
    add_con = p.constraints.add
    for g in f.groups:
        add_con().exactly_one.literals.extend(g.tolist())
    r = f.rows
    vars_all = r.vars.tolist()
    coefs_all = t.row_coefs.tolist()
    starts = r.start.tolist()
    for i, (lo, hi) in enumerate(zip(t.row_lo.tolist(), t.row_hi.tolist(), strict=True)):
        a, b = starts[i], starts[i + 1]
        lin = add_con().linear
        lin.vars.extend(vars_all[a:b])
        lin.coeffs.extend(coefs_all[a:b])
        lin.domain.extend((lo, hi))
    o = p.objective
    sign = -1.0 if f.maximize else 1.0
    coefs = t.obj_coefs if not f.maximize else -t.obj_coefs
    o.vars.extend(t.obj_vars.tolist())
    o.coeffs.extend(coefs.tolist())
    # CP-SAT reports scaling_factor * (sum + offset); a negative factor maximizes.
    o.scaling_factor = sign / t.obj_scale
    o.offset = sign * t.obj_offset * t.obj_scale
    if hint is not None:
        known = np.flatnonzero(~np.isnan(hint)).astype(np.int64)
        p.solution_hint.vars.extend(known.tolist())
        p.solution_hint.values.extend(t.hint(hint, known))
    return m, t


def solve_cpsat(
    model: Model, time_limit_s: float, options: SolveOptions, hint: FloatArray | None
) -> Outcome:
    m, t = build_proto(model, options, hint)
    if t.empty_row.any():
        row = int(np.flatnonzero(t.empty_row)[0])
        return Outcome(
            Status.INFEASIBLE,
            note=f"cpsat: equality row {row} cannot hold with integer values after scaling",
        )
    solver = cp_model.CpSolver()
    params = solver.parameters
    params.max_time_in_seconds = time_limit_s
    params.num_workers = options.threads
    if options.work_limit is not None:
        params.max_deterministic_time = options.work_limit
    params.random_seed = options.seed
    params.relative_gap_limit = options.relative_gap
    params.log_search_progress = options.log
    # CP-SAT's own SIGINT handler (on by default) replaces the process's and
    # leaves SIGINT at its default after the solve: a server would then die on
    # Ctrl-C instead of shutting down. The host owns its signals.
    params.catch_sigint_signal = False
    if not options.presolve:
        params.cp_model_presolve = False
    code = solver.solve(m)
    status = _STATUS.get(code, Status.ERROR)
    response = solver.response_proto
    if status in (Status.OPTIMAL, Status.FEASIBLE):
        values = t.values(list(response.solution))
        return Outcome(status, values, float(response.best_objective_bound))
    if status is Status.MODEL_INVALID:
        reason = " ".join((m.validate() or "model invalid").split())
        return Outcome(status, note=f"cpsat: {reason}")
    return Outcome(status)
