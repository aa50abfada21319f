"""Deadlines, refusals, fallbacks, warm starts."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import numpy as np
import pytest
from ortools.sat.python import cp_model
from planner.solvers import (
    Backend,
    BackendUnavailableError,
    Model,
    ModelTooLargeError,
    SolveOptions,
    Status,
    UnsupportedModelError,
    available_backends,
    enumeration_size,
    one_hot_envelope_model,
    solve,
)
from planner.solvers import gurobi as gurobi_backend

needs_gurobi = pytest.mark.skipif(
    importlib.util.find_spec("gurobipy") is None, reason="gurobipy not installed"
)


@pytest.fixture
def cpsat_params(monkeypatch):
    """The parameters of every CP-SAT solve in the test."""
    seen = []
    original = cp_model.CpSolver.solve

    def spy(self, model, *args, **kwargs):
        seen.append(self.parameters)
        return original(self, model, *args, **kwargs)

    monkeypatch.setattr(cp_model.CpSolver, "solve", spy)
    return seen


def test_time_limit_reaches_cpsat_and_is_respected(cpsat_params):
    hard = one_hot_envelope_model(64, 80, seed=3).model
    r = solve(hard, time_limit_s=0.02, options=SolveOptions(hint_fallback=False))
    assert r.status in (Status.FEASIBLE, Status.TIMEOUT_NO_SOLUTION)
    (params,) = cpsat_params
    assert 0 < params.max_time_in_seconds <= 0.02
    assert params.num_workers == 1
    assert r.wall_time_s < 2.0  # loose: only that the limit was not ignored
    if r.status is Status.FEASIBLE:
        assert r.best_bound is not None and r.best_bound <= r.objective
        assert r.gap is not None and r.gap >= 0
    else:
        assert r.objective is None and r.values is None


def test_work_limit_reaches_cpsat_and_stops_it_the_same_way_on_any_machine(cpsat_params):
    hard = one_hot_envelope_model(64, 80, seed=3).model
    opts = SolveOptions(work_limit=0.05, hint_fallback=False)
    first = solve(hard, time_limit_s=60.0, options=opts)
    again = solve(hard, time_limit_s=60.0, options=opts)
    assert [p.max_deterministic_time for p in cpsat_params] == [0.05, 0.05]
    assert first.status in (Status.FEASIBLE, Status.TIMEOUT_NO_SOLUTION)
    assert first.wall_time_s < 30.0  # stopped by the work, long before the clock
    # One worker, a fixed seed and a deterministic limit: the same answer.
    assert (first.status, first.objective, first.best_bound) == (
        again.status,
        again.objective,
        again.best_bound,
    )
    with pytest.raises(ValueError, match="work_limit"):
        SolveOptions(work_limit=0.0)


def test_bad_time_limit():
    m = Model()
    m.add_binaries(1)
    for bad in (0.0, -1.0, float("inf"), float("nan")):
        with pytest.raises(ValueError, match="time_limit_s"):
            solve(m, time_limit_s=bad)


def test_exhaustive_refuses_large_spaces_clearly():
    m = Model()
    x = m.add_binaries(40).reshape(10, 4)
    m.add_exactly_one_groups(x)  # 4**10 = 1,048,576 (not 2**40)
    m.add_integers(2, 0, 9)  # x 100
    assert enumeration_size(m) == 4**10 * 100
    with pytest.raises(ModelTooLargeError, match="max_enumeration"):
        solve(m, time_limit_s=1.0, backend="exhaustive")
    r = solve(m, time_limit_s=5.0, backend="exhaustive", fallback="cpsat")
    assert r.status is Status.OPTIMAL
    assert r.backend is Backend.CPSAT
    assert "fell back from exhaustive to cpsat" in r.note


def test_exhaustive_limit_is_configurable():
    m = Model()
    m.add_binaries(4)
    with pytest.raises(ModelTooLargeError):
        solve(m, time_limit_s=1.0, backend="exhaustive", options=SolveOptions(max_enumeration=15))
    r = solve(m, time_limit_s=1.0, backend="exhaustive", options=SolveOptions(max_enumeration=16))
    assert r.status is Status.OPTIMAL


def test_exhaustive_refuses_coupled_continuous_variables():
    m = Model()
    y = m.add_continuous(2, 0.0, 1.0)
    m.add_linear(y, [1.0, 1.0], "<=", 1.0)
    with pytest.raises(UnsupportedModelError, match="continuous"):
        solve(m, time_limit_s=1.0, backend="exhaustive")


def _small_model():
    m = Model()
    x = m.add_binaries(6).reshape(2, 3)
    m.add_exactly_one_groups(x)
    m.minimize(x.ravel(), [3, 1, 2, 2, 5, 1])
    return m


def test_gurobi_absent_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "gurobipy", None)  # import gurobipy -> ImportError
    with pytest.raises(BackendUnavailableError, match=r"pip install 'planner\[gurobi\]'"):
        solve(_small_model(), time_limit_s=1.0, backend="gurobi")


def test_gurobi_absent_auto_falls_back_to_cpsat(monkeypatch):
    monkeypatch.setitem(sys.modules, "gurobipy", None)
    r = solve(_small_model(), time_limit_s=1.0, backend="auto")
    assert r.status is Status.OPTIMAL
    assert r.objective == 2
    assert r.backend is Backend.CPSAT
    assert "fell back from gurobi to cpsat" in r.note
    assert "planner[gurobi]" in r.note


def _over_gurobi_size_limit():
    m = Model()
    x = m.add_binaries(2100).reshape(700, 3)
    m.add_exactly_one_groups(x)
    m.minimize(x.ravel(), np.tile([2.0, 1.0, 3.0], 700))
    return m


@needs_gurobi
def test_gurobi_over_licence_size_is_a_clear_error():
    if not _restricted_licence():
        pytest.skip("this Gurobi licence is not size-limited")
    with pytest.raises(ModelTooLargeError, match="size limit"):
        solve(_over_gurobi_size_limit(), time_limit_s=5.0, backend="gurobi")


@needs_gurobi
def test_gurobi_over_licence_size_falls_back_on_auto():
    if not _restricted_licence():
        pytest.skip("this Gurobi licence is not size-limited")
    r = solve(_over_gurobi_size_limit(), time_limit_s=5.0, backend="auto")
    assert r.status is Status.OPTIMAL
    assert r.backend is Backend.CPSAT
    assert r.objective == 700.0
    assert "fell back from gurobi to cpsat" in r.note and "size limit" in r.note


def _restricted_licence() -> bool:
    gp = gurobi_backend.import_gurobipy()
    m = gp.Model(env=gurobi_backend._environment(gp))
    try:
        m.addVars(2001)
        m.optimize()
    except gp.GurobiError as exc:
        return exc.errno == gurobi_backend.SIZE_LIMIT_ERROR
    finally:
        m.dispose()
    return False


@needs_gurobi
def test_gurobi_warm_start_and_limits_are_passed(monkeypatch):
    inst = one_hot_envelope_model(6, 8, seed=1)
    r = solve(inst.model, time_limit_s=5.0, backend="gurobi", hint=inst.start)
    ref = solve(inst.model, time_limit_s=10.0, backend="cpsat")
    assert r.status is Status.OPTIMAL and ref.status is Status.OPTIMAL
    assert r.objective == pytest.approx(ref.objective, abs=1e-6)


def test_cpsat_receives_the_warm_start(monkeypatch):
    seen = []
    original = cp_model.CpSolver.solve

    def spy(self, model, *args, **kwargs):
        seen.append((list(model.proto.solution_hint.vars), list(model.proto.solution_hint.values)))
        return original(self, model, *args, **kwargs)

    monkeypatch.setattr(cp_model.CpSolver, "solve", spy)
    inst = one_hot_envelope_model(3, 6, seed=0)
    first = solve(inst.model, time_limit_s=5.0)
    assert first.status is Status.OPTIMAL
    again = solve(inst.model, time_limit_s=5.0, hint=first)
    assert again.status is Status.OPTIMAL
    assert again.objective == pytest.approx(first.objective)
    hint_vars, hint_values = seen[1]
    assert hint_vars == list(range(inst.model.num_vars))
    assert hint_values[: inst.x.size] == first.value(inst.x.ravel()).astype(int).tolist()


def test_partial_warm_start_is_completed_and_used_when_nothing_else_is_found():
    """Only the one-hot choices are hinted; the continuous penalty and buffer
    follow from them. With no time to find anything, the warm start comes back."""
    inst = one_hot_envelope_model(64, 80, seed=0)
    r = solve(inst.model, time_limit_s=0.001, hint=inst.start)
    assert r.status is Status.FEASIBLE
    if "warm start" in r.note:  # CP-SAT found nothing in 1 ms
        x = r.value(inst.x)
        assert (x == inst.start[1].reshape(x.shape)).all()
        assert r.max_violation <= 1e-6
        assert r.objective == pytest.approx(inst.model.objective_value(r.values))


def test_infeasible_warm_start_is_not_returned():
    inst = one_hot_envelope_model(64, 80, seed=0)
    bad = np.zeros(inst.x.size)  # violates every one-hot group
    r = solve(inst.model, time_limit_s=0.001, hint=(inst.x.ravel(), bad))
    assert "warm start" not in r.note


def test_exhaustive_ignores_the_warm_start():
    m = _small_model()
    r = solve(m, time_limit_s=1.0, backend="exhaustive", hint=np.ones(m.num_vars))
    assert r.status is Status.OPTIMAL and r.objective == 2


def test_hint_length_is_checked():
    with pytest.raises(ValueError, match="hint"):
        solve(_small_model(), time_limit_s=1.0, hint=np.zeros(3))


def test_exhaustive_stops_at_its_deadline():
    m = Model()
    x = m.add_binaries(40).reshape(10, 4)
    m.add_exactly_one_groups(x)
    m.add_rows(np.ones((64, 40)), x.ravel(), "<=", 10)  # 64 rows: batches of 32,768
    m.minimize(x.ravel(), np.arange(40.0))
    r = solve(m, time_limit_s=1e-4, backend="exhaustive")
    # The first batch always runs, and holds a feasible assignment.
    assert r.status is Status.FEASIBLE
    assert "time limit" in r.note
    assert r.best_bound is None and r.gap is None
    assert r.max_violation == 0.0


def test_overflow_is_model_invalid_with_the_reason():
    m = Model()
    x = m.add_integers(3, -(2**60), 2**60)
    m.add_linear(x, [1000, 1000, 1000], "<=", 5)
    m.minimize(x, [1, 1, 1])
    r = solve(m, time_limit_s=1.0)
    assert r.status is Status.MODEL_INVALID
    assert "overflow" in r.note and "\n" not in r.note
    assert not r.has_solution


def test_available_backends():
    found = available_backends()
    assert Backend.CPSAT in found and Backend.EXHAUSTIVE in found
    assert (Backend.GUROBI in found) == (importlib.util.find_spec("gurobipy") is not None)


_SIGINT_PROBE = """
import os, signal, sys, time
from planner.solvers import Model, solve
got = []
signal.signal(signal.SIGINT, lambda signum, frame: got.append(signum))
m = Model()
x = m.add_binaries(3)
m.add_exactly_one(x)
m.minimize(x, [1, 2, 3])
solve(m, time_limit_s=1.0, backend=sys.argv[1])
os.kill(os.getpid(), signal.SIGINT)
time.sleep(0.05)
print(got)
"""


@pytest.mark.parametrize(
    "backend", ["cpsat", pytest.param("gurobi", marks=needs_gurobi), "exhaustive"]
)
def test_solve_leaves_the_process_sigint_handler_alone(backend, tmp_path):
    """CP-SAT's own SIGINT handler (catch_sigint_signal) used to leave SIGINT
    at its default after a solve: `planner serve` then died on Ctrl-C."""
    result = subprocess.run(
        [sys.executable, "-c", _SIGINT_PROBE, backend],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[2]"
