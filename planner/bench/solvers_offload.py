"""`planner bench solvers --problem offload`: the layer-offload ILP
(planner/policies/offload) solved per decode batch by each backend.

Backends: bnb (the planner's own branch and bound, search.py), cp-sat and
gurobi (the ILP of ilp.py through planner.solvers; gurobi skipped when
gurobipy is absent, a model over its pip licence's limits counted as
TOO_LARGE) and exhaustive (OffloadProblem.enumerate, every assignment, where
there are at most --max-enumeration). Every backend gets the greedy plan as
its warm start and the same time limit (exhaustive none). The instances are
seeded synthetic batches (solvers_offload_instances.py) in four memory
pressure classes.

Per size and backend: p50/p99/max wall time of the solve call (model
building excluded), status counts, calls over the limit + slack, the gap at
return, and quality: the objective against the exhaustive optimum where
enumerable, else against the best any backend found (the excess stall in %
of the step's latency). Then what pruning costs: the pruned optimum against
the "periodic" search space's, at the small sizes.
"""

from __future__ import annotations

import argparse
import datetime
import math
import sys
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from planner.bench import solvers_placement
from planner.bench.gurobi_probe import runnable_backends
from planner.bench.machine import load_average, machine_info
from planner.bench.reproduce_command import changed_options
from planner.bench.result_options import (
    add_baseline_options,
    add_output_options,
    result_command_args,
)
from planner.bench.solvers_offload_instances import PRESSURES, Instance, make_instance, setting_for
from planner.bench.solvers_offload_report import markdown_section, text_report
from planner.bench.solvers_output import EXIT_BAD_INPUT, publish, read_baseline
from planner.policies.offload.local_search import STAGGER_REQUESTS
from planner.policies.offload.search import SPREAD_IDLE_SHARE, branch_and_bound, warm_up
from planner.policies.offload.search_space import SearchMode, candidate_patterns
from planner.solvers import (
    Backend,
    BackendUnavailableError,
    ModelTooLargeError,
    SolveOptions,
    SolverError,
    Status,
    solve,
)

SECTION = "solvers:offload"
BACKENDS = (
    "bnb",
    "bnb-work",
    "bnb-work-narrow",
    "bnb-work-nospread",
    "bnb-long",
    "cp-sat",
    "gurobi",
    "exhaustive",
)
# Stopped on work alone: bnb-work-narrow is bnb-work without the local
# search's stagger moves (local_search.py) nor the spread moves (the spread
# start's descent, search.py, and the spread kicks); bnb-work-nospread
# without the spread moves only (the search before them).
WORK_BACKENDS = ("bnb-work", "bnb-work-narrow", "bnb-work-nospread")
# The reference where enumeration is out of reach: the branch and bound with
# a long limit (bnb-long), for "within 1% of the best known".
DEFAULT_REFERENCE_TIME_LIMIT_S = 1.0
DEFAULT_SIZES = ((4, 32), (16, 32), (32, 48), (64, 80))
DEFAULT_INSTANCES = 60
# Per size, the limit the targets are measured at (the target less a margin
# for the call's overhead); other sizes get DEFAULT_TIME_LIMIT_S.
SIZE_TIME_LIMITS_S = {(4, 32): 0.0045, (16, 32): 0.0045, (64, 80): 0.019}
DEFAULT_TIME_LIMIT_S = 0.01
# bnb-work: the same search stopped on work alone (the same plans on any
# machine, however loaded): per size, the nodes one core of the bench
# machine (AMD EPYC) does within SIZE_TIME_LIMITS_S on the size's costliest
# instance (a node costs 2-5 us at 16x32, 5-20 us at 64x80: more for plans
# with more fetches; about 1.4 us at 4x32, where the compiled tree does most
# of the work), else DEFAULT_NODE_LIMIT; its time limit, WORK_TIME_LIMIT_S,
# is a backstop.
SIZE_NODE_LIMITS = {(4, 32): 3000, (16, 32): 900, (64, 80): 1000}
DEFAULT_NODE_LIMIT = 1000
WORK_TIME_LIMIT_S = 1.0
DEFAULT_SLACK_MS = 2.0
DEFAULT_MAX_ENUMERATION = 2_000_000
DEFAULT_PRUNING_INSTANCES = 12
DEFAULT_PRUNING_TIME_LIMIT_S = 2.0
DEFAULT_SEED = 0
# The targets: p99 solve time at a size in every pressure class, and the plan
# within QUALITY_TARGET_PCT of the best known (step latency).
# (requests, layers), p99 limit in ms (None: a quality target only; at
# 4x32 the best known plan is the exhaustive optimum).
TARGETS: tuple[tuple[tuple[int, int], float | None], ...] = (
    ((4, 32), None),
    ((16, 32), 5.0),
    ((64, 80), 20.0),
)
QUALITY_TARGET_PCT = 1.0
TOO_LARGE = "TOO_LARGE"
ERROR = "ERROR"
SOLVED = (Status.OPTIMAL.value, Status.FEASIBLE.value)


@dataclass
class Outcome:
    """One backend on one instance."""

    status: str
    wall_s: float
    objective: float | None  # the plan's exact step latency, s
    reported: float | None  # the backend's own objective (None: not in seconds)
    bound: float | None  # a bound on the exact latency, s (None: none proved)
    gap: float | None
    nodes: int = 0
    note: str = ""
    cpu_s: float | None = None  # this process's CPU time in the call (None: not measured)


@dataclass
class Config:
    sizes: tuple[tuple[int, int], ...] = DEFAULT_SIZES
    backends: tuple[str, ...] = BACKENDS
    instances: int = DEFAULT_INSTANCES
    time_limit_s: float | None = None  # None: SIZE_TIME_LIMITS_S
    reference_time_limit_s: float = DEFAULT_REFERENCE_TIME_LIMIT_S
    slack_ms: float = DEFAULT_SLACK_MS
    max_enumeration: int = DEFAULT_MAX_ENUMERATION
    pruning_instances: int = DEFAULT_PRUNING_INSTANCES
    pruning_time_limit_s: float = DEFAULT_PRUNING_TIME_LIMIT_S
    seed: int = DEFAULT_SEED

    def limit_for(self, size: tuple[int, int]) -> float:
        if self.time_limit_s is not None:
            return self.time_limit_s
        return SIZE_TIME_LIMITS_S.get(size, DEFAULT_TIME_LIMIT_S)

    def nodes_for(self, size: tuple[int, int]) -> int:
        return SIZE_NODE_LIMITS.get(size, DEFAULT_NODE_LIMIT)

    def to_json(self) -> dict[str, Any]:
        return {
            "sizes": [f"{r}x{n}" for r, n in self.sizes],
            "backends": list(self.backends),
            "instances_per_size": self.instances,
            "time_limit_s": self.time_limit_s,
            "time_limits_ms": {f"{r}x{n}": self.limit_for((r, n)) * 1e3 for r, n in self.sizes},
            "node_limits": {f"{r}x{n}": self.nodes_for((r, n)) for r, n in self.sizes},
            "reference_time_limit_s": self.reference_time_limit_s,
            "slack_ms": self.slack_ms,
            "max_enumeration": self.max_enumeration,
            "pruning_instances": self.pruning_instances,
            "pruning_time_limit_s": self.pruning_time_limit_s,
            "seed": self.seed,
            "pressure_classes": list(PRESSURES),
        }


@dataclass
class Measured:
    cases: list[dict[str, Any]] = field(default_factory=list)
    pruning: list[dict[str, Any]] = field(default_factory=list)
    anomalies: list[dict[str, Any]] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)  # backend -> why
    load: list[float] = field(default_factory=list)  # 1-min load average before each size
    settings: dict[str, str] = field(default_factory=dict)  # layers -> profile used


# --- running the backends ----------------------------------------------------------


def _run_bnb(
    inst: Instance,
    limit_s: float,
    node_limit: int | None = None,
    stagger_requests: int = STAGGER_REQUESTS,
    spread: bool = True,
) -> Outcome:
    starts = [inst.greedy] if inst.greedy is not None else []
    cpu = time.process_time()
    started = time.perf_counter()
    r = branch_and_bound(
        inst.problem,
        time_limit_s=limit_s,
        starts=starts,
        node_limit=node_limit,
        stagger_requests=stagger_requests,
        spread_idle_share=SPREAD_IDLE_SHARE if spread else None,
        spread_kicks=spread,
    )
    wall = time.perf_counter() - started
    cpu = time.process_time() - cpu
    return Outcome(
        r.status.value, wall, r.objective, r.objective, r.best_bound, r.gap, r.nodes, cpu_s=cpu
    )


def _run_model(inst: Instance, limit_s: float, backend: Backend) -> Outcome:
    ilp = inst.ilp()
    hint = inst.hint()
    started = time.perf_counter()
    try:
        r = solve(
            ilp.model, time_limit_s=limit_s, backend=backend, hint=hint, options=SolveOptions()
        )
    except ModelTooLargeError as exc:
        wall = time.perf_counter() - started
        return Outcome(TOO_LARGE, wall, None, None, None, None, note=str(exc))
    except BackendUnavailableError:
        raise
    except SolverError as exc:
        return Outcome(ERROR, time.perf_counter() - started, None, None, None, None, note=str(exc))
    wall = time.perf_counter() - started
    objective = None
    if r.has_solution:
        choice = np.argmax(r.value(ilp.choice), axis=1).astype(np.int64)
        value = float(inst.problem.evaluate(choice).objective[0])
        objective = value if math.isfinite(value) else None
    # The ILP optimises the surrogate: its objective, bound and gap are not
    # in exact-model seconds, so only its plan is compared.
    return Outcome(r.status.value, wall, objective, None, None, None, note=r.note)


def _run_exhaustive(inst: Instance) -> Outcome:
    started = time.perf_counter()
    found = inst.problem.enumerate()
    wall = time.perf_counter() - started
    choice, best = found.choice, found.latency
    if choice is None:
        return Outcome(Status.INFEASIBLE.value, wall, None, None, None, None)
    return Outcome(Status.OPTIMAL.value, wall, best, best, best, 0.0)


def _warm_up(backends: Sequence[str], seed: int) -> None:
    """One untimed solve per backend (imports, loading the compiled search,
    CP-SAT's and Gurobi's start)."""
    inst = make_instance(4, 8, 1, seed)
    for b in backends:
        if b.startswith("bnb"):
            warm_up()
            _run_bnb(inst, 0.05)
        elif b in ("cp-sat", "gurobi"):
            _run_model(inst, 0.05, Backend.CPSAT if b == "cp-sat" else Backend.GUROBI)


# --- statistics --------------------------------------------------------------------


def _pct(values: Sequence[float], q: float) -> float | None:
    return float(np.percentile(values, q)) if values else None


def _excess_pct(objective: float | None, best: float | None) -> float | None:
    """The extra step latency over the best plan's, in % of the best plan's."""
    if objective is None or best is None:
        return None
    return 100.0 * (objective - best) / best


def _same(a: float | None, b: float | None) -> bool:
    if a is None or b is None:
        return a is b
    return abs(a - b) <= 1e-9 * max(1.0, abs(a), abs(b))


def _case(  # noqa: PLR0917
    size: tuple[int, int],
    backend: str,
    limit_s: float | None,
    slack_ms: float,
    runs: list[tuple[Instance, Outcome]],
    reference: dict[int, Outcome],
    best: dict[int, Outcome],
) -> dict[str, Any]:
    walls = [o.wall_s * 1e3 for _, o in runs]
    cpus = [o.cpu_s * 1e3 for _, o in runs if o.cpu_s is not None]
    nodes = [o.nodes for _, o in runs if o.nodes]
    statuses = Counter(o.status for _, o in runs)
    over = []
    if limit_s is not None:
        over = [(i, o) for i, o in runs if o.wall_s * 1e3 > limit_s * 1e3 + slack_ms]
    gaps = [o.gap for _, o in runs if o.gap is not None and math.isfinite(o.gap)]
    exact_n = exact_same = 0
    vs_best_n = vs_best_same = 0
    excess: list[float] = []
    for inst, o in runs:
        ref = reference.get(inst.index)
        if ref is not None:
            exact_n += 1
            exact_same += _same(o.objective, ref.objective)
        b = best.get(inst.index)
        if b is not None and b.objective is not None:
            vs_best_n += 1
            vs_best_same += _same(o.objective, b.objective)
            e = _excess_pct(o.objective, b.objective)
            if e is not None:
                excess.append(e)
    by_class: dict[str, dict[str, Any]] = {}
    for p in PRESSURES:
        w = [o.wall_s * 1e3 for i, o in runs if i.pressure == p]
        cpu = [o.cpu_s * 1e3 for i, o in runs if i.pressure == p and o.cpu_s is not None]
        st = Counter(o.status for i, o in runs if i.pressure == p)
        by_class[p] = {
            "n": len(w),
            "p50_ms": _pct(w, 50),
            "p99_ms": _pct(w, 99),
            "max_ms": max(w) if w else None,
            "cpu_p99_ms": _pct(cpu, 99),
            "statuses": dict(st),
        }
    return {
        "requests": size[0],
        "layers": size[1],
        "backend": backend,
        "n": len(runs),
        "time_limit_ms": None if limit_s is None else limit_s * 1e3,
        "p50_ms": _pct(walls, 50),
        "p99_ms": _pct(walls, 99),
        "max_ms": max(walls) if walls else None,
        "mean_ms": float(np.mean(walls)) if walls else None,
        "cpu_p50_ms": _pct(cpus, 50),
        "cpu_p99_ms": _pct(cpus, 99),
        "nodes_p50": _pct([float(n) for n in nodes], 50),
        "nodes_max": max(nodes) if nodes else None,
        "statuses": dict(statuses),
        "over_limit": len(over),
        "over_limit_worst_ms": max((o.wall_s * 1e3 for _, o in over), default=None),
        "gap_p50": _pct(gaps, 50),
        "gap_max": max(gaps) if gaps else None,
        "vs_exhaustive": {"compared": exact_n, "identical": exact_same},
        "vs_best": {
            "compared": vs_best_n,
            "best": vs_best_same,
            "excess_stall_pct_of_step_mean": float(np.mean(excess)) if excess else None,
            "excess_stall_pct_of_step_max": max(excess) if excess else None,
            "no_plan": vs_best_n - len(excess),
        },
        "by_pressure": by_class,
    }


def _check(
    size: tuple[int, int],
    results: dict[str, list[tuple[Instance, Outcome]]],
    anomalies: list[dict[str, Any]],
) -> None:
    """Contradictions between backends on the same instance: two proved
    optima that differ, a proof of infeasibility next to a plan, a bound past
    another backend's plan, a backend's objective below its plan's."""
    by_index: dict[int, dict[str, tuple[Instance, Outcome]]] = {}
    for backend, runs in results.items():
        for inst, o in runs:
            by_index.setdefault(inst.index, {})[backend] = (inst, o)
    for entries in by_index.values():
        items = list(entries.items())
        inst = items[0][1][0]

        def note(kind: str, detail: str, inst: Instance = inst) -> None:
            anomalies.append(
                {
                    "size": f"{size[0]}x{size[1]}",
                    "instance": inst.index,
                    "seed": inst.seed,
                    "pressure": inst.pressure,
                    "kind": kind,
                    "detail": detail,
                }
            )

        for b, (_, o) in items:
            if (
                o.reported is not None
                and o.objective is not None
                and o.objective > o.reported + 1e-6
            ):
                note(
                    "objective",
                    f"{b} reports {o.reported:.6g}, its plan evaluates to {o.objective:.6g}",
                )
        for a, (_, oa) in items:
            for b, (_, ob) in items:
                if a >= b:
                    continue
                if oa.status == ob.status == Status.OPTIMAL.value and not _same(
                    oa.objective, ob.objective
                ):
                    note(
                        "optimum",
                        f"{a} OPTIMAL {oa.objective:.6g} != {b} OPTIMAL {ob.objective:.6g}",
                    )
                for x, ox, y, oy in ((a, oa, b, ob), (b, ob, a, oa)):
                    if ox.status == Status.INFEASIBLE.value and oy.objective is not None:
                        note(
                            "feasibility",
                            f"{x} says INFEASIBLE, {y} found {oy.objective:.6g} ({oy.status})",
                        )
                    if (
                        ox.bound is not None
                        and oy.objective is not None
                        and ox.bound > oy.objective * (1 + 1e-9) + 1e-6
                    ):
                        note("bound", f"{x} bound {ox.bound:.6g} > {y} plan {oy.objective:.6g}")


# --- the run -----------------------------------------------------------------------


def run_bench(config: Config, progress: Callable[[str], None] = lambda _: None) -> Measured:
    measured = Measured()
    backends = runnable_backends(config.backends, measured.skipped, progress)
    _warm_up(backends, config.seed)
    for size in config.sizes:
        requests, layers = size
        now_load = load_average()
        if now_load is not None:
            measured.load.append(now_load)
        measured.settings[str(layers)] = setting_for(layers).describe()
        started = time.perf_counter()
        instances = [
            make_instance(requests, layers, i, config.seed) for i in range(config.instances)
        ]
        progress(
            f"{requests}x{layers}: {len(instances)} instances made in "
            f"{time.perf_counter() - started:.1f} s"
        )
        # Untimed: what a size pays once per process (the bound's set-up for
        # its pattern set).
        _run_bnb(instances[0], 0.05)
        results: dict[str, list[tuple[Instance, Outcome]]] = {}
        for backend in backends:
            if backend == "exhaustive":
                runs = [
                    (i, _run_exhaustive(i))
                    for i in instances
                    if i.problem.enumeration_size() <= config.max_enumeration
                ]
                if not runs:
                    continue
            elif backend == "bnb":
                runs = [(i, _run_bnb(i, config.limit_for(size))) for i in instances]
            elif backend in WORK_BACKENDS:
                nodes = config.nodes_for(size)
                stagger = 0 if backend == "bnb-work-narrow" else STAGGER_REQUESTS
                spread = backend == "bnb-work"
                runs = [
                    (i, _run_bnb(i, WORK_TIME_LIMIT_S, nodes, stagger, spread)) for i in instances
                ]
            elif backend == "bnb-long":
                runs = [
                    (i, _run_bnb(i, config.reference_time_limit_s))
                    for i in instances
                    if i.problem.enumeration_size() > config.max_enumeration
                ]
                if not runs:
                    continue
            else:
                kind = Backend.CPSAT if backend == "cp-sat" else Backend.GUROBI
                runs = [(i, _run_model(i, config.limit_for(size), kind)) for i in instances]
            results[backend] = runs
            progress(f"{requests}x{layers}: {backend} done")
        reference = {i.index: o for i, o in results.get("exhaustive", [])}
        best: dict[int, Outcome] = {}
        for runs in results.values():
            for inst, o in runs:
                if o.objective is None:
                    continue
                held = best.get(inst.index)
                if held is None or o.objective < (held.objective or math.inf):
                    best[inst.index] = o
        for backend, runs in results.items():
            limit = {
                "exhaustive": None,
                "bnb-long": config.reference_time_limit_s,
                "bnb-work": WORK_TIME_LIMIT_S,
                "bnb-work-narrow": WORK_TIME_LIMIT_S,
                "bnb-work-nospread": WORK_TIME_LIMIT_S,
            }.get(backend, config.limit_for(size))
            case = _case(size, backend, limit, config.slack_ms, runs, reference, best)
            if backend in WORK_BACKENDS:
                case["node_limit"] = config.nodes_for(size)
            measured.cases.append(case)
        _check(size, results, measured.anomalies)
        for backend, runs in results.items():
            if backend in ("exhaustive", "bnb-long", *WORK_BACKENDS):
                continue
            limit_s = config.limit_for(size)
            for inst, o in runs:
                if o.wall_s * 1e3 > limit_s * 1e3 + config.slack_ms:
                    measured.anomalies.append(
                        {
                            "size": f"{requests}x{layers}",
                            "instance": inst.index,
                            "seed": inst.seed,
                            "pressure": inst.pressure,
                            "kind": "time limit",
                            "detail": f"{backend} took {o.wall_s * 1e3:.1f} ms ({o.status}), "
                            f"limit {limit_s * 1e3:g} ms",
                            "wall_ms": o.wall_s * 1e3,
                        }
                    )
    measured.pruning = _pruning(config, progress)
    return measured


def _pruning(config: Config, progress: Callable[[str], None]) -> list[dict[str, Any]]:
    """What pruning costs: per small size, the pruned space's optimum (bnb)
    against the periodic space's (bnb from the pruned plan, a longer limit),
    on the feasible instances where both searches finish."""
    out: list[dict[str, Any]] = []
    if config.pruning_instances < 1:
        return out
    for requests, layers in config.sizes:
        if requests > 4:
            continue
        compared = proved = same = 0
        excess: list[float] = []
        rel: list[float] = []
        periodic_choices = 0
        wall: list[float] = []
        for index in range(config.pruning_instances):
            inst = make_instance(requests, layers, index, config.seed)
            if inst.pressure == "infeasible":
                continue
            pruned = branch_and_bound(
                inst.problem,
                time_limit_s=config.pruning_time_limit_s,
                starts=[inst.greedy] if inst.greedy is not None else [],
            )
            if pruned.status != Status.OPTIMAL or pruned.choice is None:
                continue
            problem, cands = inst.problem_in(SearchMode.PERIODIC)
            periodic_choices = len(cands)
            index_of = {row.tobytes(): c for c, row in enumerate(cands.offloaded)}
            start = np.array(
                [index_of[inst.candidates.offloaded[c].tobytes()] for c in pruned.choice],
                dtype=np.int64,
            )
            started = time.perf_counter()
            wide = branch_and_bound(
                problem, time_limit_s=config.pruning_time_limit_s, starts=[start]
            )
            wall.append(time.perf_counter() - started)
            compared += 1
            if wide.status != Status.OPTIMAL or wide.choice is None or wide.objective is None:
                continue
            proved += 1
            assert pruned.objective is not None
            same += _same(pruned.objective, wide.objective)
            e = _excess_pct(pruned.objective, wide.objective)
            excess.append(e if e is not None else 0.0)
            rel.append((pruned.objective - wide.objective) / max(abs(wide.objective), 1.0))
        progress(f"{requests}x{layers}: pruning compared on {compared} instances")
        out.append(
            {
                "requests": requests,
                "layers": layers,
                "pruned_choices": len(candidate_patterns(layers, SearchMode.PRUNED)),
                "periodic_choices": periodic_choices,
                "compared": compared,
                "periodic_proved_optimal": proved,
                "identical": same,
                "excess_stall_pct_of_step_mean": float(np.mean(excess)) if excess else None,
                "excess_stall_pct_of_step_max": max(excess) if excess else None,
                "objective_rel_excess_max": max(rel) if rel else None,
                "periodic_bnb_p50_ms": _pct([w * 1e3 for w in wall], 50),
                "periodic_bnb_max_ms": max(wall) * 1e3 if wall else None,
                "time_limit_s": config.pruning_time_limit_s,
            }
        )
    return out


def evaluate_targets(cases: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per target size and timed backend: p99 in every pressure class within
    the target, and the plan within QUALITY_TARGET_PCT of the best known."""
    out = []
    for (requests, layers), limit_ms in TARGETS:
        for c in cases:
            if (c["requests"], c["layers"]) != (requests, layers) or c["backend"] in (
                "exhaustive",
                "bnb-long",
            ):
                continue
            # bnb-work stops on work: its latency is judged on CPU time (the
            # wall time of a loaded machine adds the waits for a core).
            on_cpu = c["backend"] in WORK_BACKENDS
            worst_class, worst_p99 = None, -math.inf
            worst_cpu = None
            for name, cls in c["by_pressure"].items():
                p99 = cls["cpu_p99_ms"] if on_cpu else cls["p99_ms"]
                if p99 is not None and p99 > worst_p99:
                    worst_class, worst_p99 = name, p99
                cpu = cls.get("cpu_p99_ms")
                if cpu is not None and (worst_cpu is None or cpu > worst_cpu):
                    worst_cpu = cpu
            excess = c["vs_best"]["excess_stall_pct_of_step_max"]
            no_plan = c["vs_best"]["no_plan"]
            quality_met = excess is not None and excess <= QUALITY_TARGET_PCT and not no_plan
            out.append(
                {
                    "size": f"{requests}x{layers}",
                    "backend": c["backend"],
                    "p99_limit_ms": limit_ms,
                    "p99_ms": c["cpu_p99_ms"] if on_cpu else c["p99_ms"],
                    "p99_on": "cpu" if on_cpu else "wall",
                    "worst_class": worst_class,
                    "worst_class_p99_ms": worst_p99,
                    "p99_status": (
                        "none" if limit_ms is None else "met" if worst_p99 <= limit_ms else "missed"
                    ),
                    "worst_class_cpu_p99_ms": worst_cpu,
                    "quality_limit_pct": QUALITY_TARGET_PCT,
                    "excess_max_pct": excess,
                    "no_plan": no_plan,
                    "quality_status": "met" if quality_met else "missed",
                    "within_time_limit": on_cpu or c["over_limit"] == 0,
                }
            )
    return out


def compare_baseline(
    cases: list[dict[str, Any]], baseline: dict[str, Any], factor: float
) -> dict[str, Any]:
    """Cases in both runs, matched by (requests, layers, backend); a case
    regressed when its p50 grew beyond factor x the old one."""
    old = {(c["requests"], c["layers"], c["backend"]): c for c in baseline["cases"]}
    compared = []
    for c in cases:
        before = old.get((c["requests"], c["layers"], c["backend"]))
        if before is None:
            continue
        ratio = c["p50_ms"] / before["p50_ms"] if before["p50_ms"] > 0 else math.inf
        compared.append(
            {
                "size": f"{c['requests']}x{c['layers']}",
                "backend": c["backend"],
                "old_p50_ms": before["p50_ms"],
                "new_p50_ms": c["p50_ms"],
                "old_p99_ms": before["p99_ms"],
                "new_p99_ms": c["p99_ms"],
                "p50_ratio": ratio,
                "regressed": ratio > factor,
            }
        )
    return {
        "factor": factor,
        "baseline_date": baseline.get("date"),
        "baseline_commit": (baseline.get("machine", {}).get("git") or {}).get("commit"),
        "cases": compared,
        "regressions": sum(c["regressed"] for c in compared),
        "unmatched": len(cases) - len(compared),
    }


# --- command line ------------------------------------------------------------------


def _size_list(text: str) -> tuple[tuple[int, int], ...]:
    sizes = []
    for part in text.split(","):
        if not part.strip():
            continue
        r, sep, n = part.strip().lower().partition("x")
        try:
            size = (int(r), int(n))
        except ValueError:
            size = (0, 0)
        if not sep or size[0] < 1 or size[1] < 2:
            raise argparse.ArgumentTypeError(
                f"expected REQUESTSxLAYERS[,...] with requests >= 1 and layers >= 2, got {part!r}"
            )
        sizes.append(size)
    if not sizes:
        raise argparse.ArgumentTypeError("no size given")
    return tuple(sizes)


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not (value > 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value


def _count(minimum: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be >= {minimum}, got {value}")
        return value

    return parse


def register(benches: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = benches.add_parser(
        "solvers",
        help="solve time and plan quality of a formulation per backend and size",
        description="The layer-offload ILP on seeded synthetic long-context decode batches: "
        "solve time per backend and size (p50/p99/max, status counts, calls over the time "
        "limit), plan quality against exhaustive enumeration or the best plan any backend "
        "found, and what the pruned search space costs. Exit status 1 when --baseline finds "
        "a regression, 2 on bad input. --problem placement: AQUA's placer on 16 to 1,024 "
        "GPUs (--gpus, --limits): objective, bound and gap per time limit, time to 1% and "
        "to proven optimality, the anchor and targets MET/MISSED.",
    )
    p.add_argument(
        "--problem",
        choices=["offload", "placement"],
        default="offload",
        help="offload: the layer-offload ILP; placement: AQUA's placer "
        "(solvers_placement.py) (default offload)",
    )
    p.add_argument(
        "--sizes",
        type=_size_list,
        default=DEFAULT_SIZES,
        help="REQUESTSxLAYERS, comma-separated (default "
        + ",".join(f"{r}x{n}" for r, n in DEFAULT_SIZES)
        + ")",
    )
    p.add_argument(
        "--backend",
        action="append",
        choices=BACKENDS,
        help="backends to run (repeat; default all: " + ", ".join(BACKENDS) + ")",
    )
    p.add_argument(
        "--instances",
        type=_count(1),
        default=None,
        help=f"instances per size, spread over the {len(PRESSURES)} pressure classes "
        f"(default {DEFAULT_INSTANCES}; placement: 3, one per producer/consumer mix)",
    )
    p.add_argument(
        "--time-limit",
        type=_positive_float,
        default=None,
        help="seconds per solve for bnb, cp-sat and gurobi (default per size: "
        + ", ".join(f"{r}x{n} {v * 1e3:g} ms" for (r, n), v in SIZE_TIME_LIMITS_S.items())
        + f", else {DEFAULT_TIME_LIMIT_S * 1e3:g} ms)",
    )
    p.add_argument(
        "--reference-time-limit",
        type=_positive_float,
        default=DEFAULT_REFERENCE_TIME_LIMIT_S,
        help="seconds per bnb-long solve, the reference where enumeration is out of reach "
        f"(default {DEFAULT_REFERENCE_TIME_LIMIT_S:g})",
    )
    p.add_argument(
        "--slack-ms",
        type=float,
        default=DEFAULT_SLACK_MS,
        help=f"a call over limit + this counts as over the limit (default {DEFAULT_SLACK_MS:g})",
    )
    p.add_argument(
        "--max-enumeration",
        type=_count(1),
        default=None,
        help=f"exhaustive only where at most this many assignments (default "
        f"{DEFAULT_MAX_ENUMERATION:,}; placement: 200,000)",
    )
    solvers_placement.add_arguments(p)
    p.add_argument(
        "--pruning-instances",
        type=_count(0),
        default=DEFAULT_PRUNING_INSTANCES,
        help="instances per size of at most 4 requests on which pruned and periodic spaces are "
        f"compared; 0 for none (default {DEFAULT_PRUNING_INSTANCES})",
    )
    p.add_argument(
        "--pruning-time-limit",
        type=_positive_float,
        default=DEFAULT_PRUNING_TIME_LIMIT_S,
        help=f"seconds per bnb solve in that comparison (default {DEFAULT_PRUNING_TIME_LIMIT_S:g})",
    )
    p.add_argument("--seed", type=int, default=DEFAULT_SEED, help="instances' seed (default 0)")
    add_output_options(p)
    add_baseline_options(p)
    p.set_defaults(func=run)


def config_from(args: argparse.Namespace) -> Config:
    return Config(
        sizes=args.sizes,
        backends=tuple(dict.fromkeys(args.backend or BACKENDS)),
        instances=args.instances or DEFAULT_INSTANCES,
        time_limit_s=args.time_limit,
        reference_time_limit_s=args.reference_time_limit,
        slack_ms=args.slack_ms,
        max_enumeration=args.max_enumeration or DEFAULT_MAX_ENUMERATION,
        pruning_instances=args.pruning_instances,
        pruning_time_limit_s=args.pruning_time_limit,
        seed=args.seed,
    )


def command_line(args: argparse.Namespace, config: Config) -> str:
    """The command that reproduces this run (defaults omitted)."""
    d = Config()
    parts = ["planner", "bench", "solvers", "--problem", args.problem]
    if config.sizes != d.sizes:
        parts += ["--sizes", ",".join(f"{r}x{n}" for r, n in config.sizes)]
    if args.backend:
        for b in config.backends:
            parts += ["--backend", b]
    parts += changed_options(
        ("--instances", config.instances, d.instances),
        ("--time-limit", config.time_limit_s, d.time_limit_s),
        ("--reference-time-limit", config.reference_time_limit_s, d.reference_time_limit_s),
        ("--slack-ms", config.slack_ms, d.slack_ms),
        ("--max-enumeration", config.max_enumeration, d.max_enumeration),
        ("--pruning-instances", config.pruning_instances, d.pruning_instances),
        ("--pruning-time-limit", config.pruning_time_limit_s, d.pruning_time_limit_s),
        ("--seed", config.seed, d.seed),
    )
    parts += result_command_args(args)
    return " ".join(parts)


def _progress(message: str) -> None:
    print(f"bench: {message}", file=sys.stderr, flush=True)


def run(args: argparse.Namespace) -> int:

    if args.problem == "placement":
        return solvers_placement.run(args)
    if args.gpus is not None or args.limits is not None:
        print(
            "planner bench solvers: --gpus and --limits are for --problem placement",
            file=sys.stderr,
        )
        return EXIT_BAD_INPUT
    if args.slack_ms < 0 or not math.isfinite(args.slack_ms):
        print("planner bench solvers: --slack-ms must be >= 0", file=sys.stderr)
        return EXIT_BAD_INPUT
    usable, baseline = read_baseline(args)
    if not usable:
        return EXIT_BAD_INPUT
    config = config_from(args)
    machine = machine_info()
    started = time.perf_counter()
    measured = run_bench(config, progress=_progress)
    machine["load_avg_1m_at_end"] = load_average()
    doc: dict[str, Any] = {
        "bench": f"solvers/{args.problem}",
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "command": command_line(args, config),
        "machine": machine,
        "config": config.to_json(),
        "settings": measured.settings,
        "load_avg_1m_by_size": measured.load,
        "skipped": measured.skipped,
        "wall_s": time.perf_counter() - started,
        "cases": measured.cases,
        "targets": evaluate_targets(measured.cases),
        "pruning": measured.pruning,
        "anomalies": measured.anomalies,
        "baseline": None,
    }
    return publish(doc, args, baseline, compare_baseline, text_report, markdown_section, SECTION)
