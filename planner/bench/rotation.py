"""The rotation policy's decision latency, measured three ways: the policy
function on a prebuilt domain snapshot, the in-process RPC path (proto in,
proto out, conversion included) and a real server over gRPC on loopback."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from functools import partial
from typing import Any

from google.protobuf.message import Message

from planner.bench.proto_request import FORMS, plan_rotation_request
from planner.bench.results import CaseResult, PlanSummary, sort_key
from planner.bench.server_process import ServerProcess
from planner.bench.stats import LatencyStats
from planner.bench.synthetic import SyntheticSnapshot, WorkloadMix, generate
from planner.bench.timing import default_calls, default_warmup, time_calls
from planner.client import PlannerClient
from planner.domain.requests import Snapshot
from planner.domain.rotation import RotationInputs, RotationPlan
from planner.policies.rotation import plan_rotation
from planner.rpc import RPCS
from planner.service.convert.rotation import rotation_plan_to_proto
from planner.service.limits import ServiceLimits
from planner.service.methods import CallContext, handle
from planner.v1 import rotation_pb2

PLAN_ROTATION = RPCS["RotationService.PlanRotation"]
GRPC_DEADLINE_S = 30.0
# Calls of the near-empty GetPlannerInfo RPC that give the gRPC floor: what
# a round trip costs on this machine before any planning.
FLOOR_CALLS = 1000

Progress = Callable[[str], None]


@dataclass(frozen=True, slots=True)
class RotationBenchConfig:
    sizes: tuple[int, ...] = (100, 1000, 10_000)
    block_level_sizes: tuple[int, ...] = (100, 1000)
    seed: int = 0
    # None: default_calls(size) / default_warmup(calls).
    calls: int | None = None
    warmup: int | None = None
    grpc: bool = True
    # Seconds one case may take when calls is not given: slow cases get fewer
    # calls (never fewer than timing.MIN_CALLS).
    case_budget_s: float = 20.0
    mix: WorkloadMix = field(default_factory=WorkloadMix)

    def calls_for(self, size: int) -> int:
        return self.calls if self.calls is not None else default_calls(size)

    def budget_s(self) -> float | None:
        return None if self.calls is not None else self.case_budget_s

    def warmup_for(self, size: int) -> int:
        return self.warmup if self.warmup is not None else default_warmup(self.calls_for(size))

    def to_json(self) -> dict[str, Any]:
        sizes = sorted({*self.sizes, *self.block_level_sizes})
        return {
            "sizes": list(self.sizes),
            "block_level_sizes": list(self.block_level_sizes),
            "seed": self.seed,
            "calls": {str(n): self.calls_for(n) for n in sizes},
            "case_budget_s": self.budget_s(),
            "warmup": {str(n): self.warmup_for(n) for n in sizes},
            "grpc": self.grpc,
            "workload": asdict(self.mix),
            "gc": "enabled; collected before each case",
            "clock": "time.perf_counter_ns",
        }


@dataclass(frozen=True, slots=True)
class BenchCase:
    """One decision problem: the domain snapshot and its proto requests (one
    per encoding), all checked to give the same plan."""

    level: str
    synthetic: SyntheticSnapshot
    snapshot: Snapshot
    inputs: RotationInputs
    requests: dict[str, rotation_pb2.PlanRotationRequest]
    response: Message
    plan: PlanSummary

    @property
    def size(self) -> int:
        return len(self.synthetic.requests)


def _summary(plan: RotationPlan, response: Message) -> PlanSummary:
    return PlanSummary(
        fcfs_fallback=plan.fcfs_fallback,
        prioritized=len(plan.prioritized),
        preempted=len(plan.preempted),
        block_moves=sum(len(m.src_block_ids) for m in plan.moves),
        blocks_needed=plan.explanation.blocks_needed,
        free_gpu_blocks=plan.explanation.free_gpu_blocks,
        response_bytes=response.ByteSize(),
    )


def build_case(size: int, seed: int, block_level: bool, mix: WorkloadMix) -> BenchCase:
    """One decision problem in every form, checked to give the same answer.
    Block-level snapshots travel as rows only (the contract's rule)."""
    synthetic = generate(size, seed, block_level=block_level, mix=mix)
    snapshot, inputs = synthetic.snapshot(), synthetic.inputs()
    forms = ("rows",) if block_level else FORMS
    requests = {form: plan_rotation_request(synthetic, form) for form in forms}
    plan = plan_rotation(snapshot, inputs)
    response = rotation_plan_to_proto(plan)
    for form, request in requests.items():
        if handle(PLAN_ROTATION, request, _context()) != response:
            raise AssertionError(f"the {form} request and the domain snapshot disagree")
    return BenchCase(
        level="block" if block_level else "counts",
        synthetic=synthetic,
        snapshot=snapshot,
        inputs=inputs,
        requests=requests,
        response=response,
        plan=_summary(plan, response),
    )


def _context() -> CallContext:
    return CallContext(ServiceLimits(), None)


def _in_process(
    case: BenchCase, config: RotationBenchConfig, progress: Progress
) -> list[CaseResult]:
    calls, warmup = config.calls_for(case.size), config.warmup_for(case.size)
    snapshot, inputs, ctx = case.snapshot, case.inputs, _context()
    progress(f"{case.level} {case.size}: plan_rotation, {calls} calls")
    stats = time_calls(lambda: plan_rotation(snapshot, inputs), calls, warmup, config.budget_s())
    results = [CaseResult(case.level, case.size, "policy", "domain", stats, case.plan)]
    for form, request in case.requests.items():
        progress(f"{case.level} {case.size}: in-process RPC ({form}), {calls} calls")
        stats = time_calls(
            partial(handle, PLAN_ROTATION, request, ctx), calls, warmup, config.budget_s()
        )
        results.append(
            CaseResult(case.level, case.size, "rpc", form, stats, case.plan, request.ByteSize())
        )
    return results


@dataclass(frozen=True, slots=True)
class RotationRun:
    results: list[CaseResult]
    # GetPlannerInfo round trips against the same server; None without gRPC.
    grpc_floor: LatencyStats | None = None


def _over_grpc(
    cases: list[BenchCase], config: RotationBenchConfig, progress: Progress
) -> tuple[list[CaseResult], LatencyStats]:
    results = []
    progress("starting planner serve --port 0")
    with (
        ServerProcess() as server,
        PlannerClient(server.address, deadline_s=GRPC_DEADLINE_S) as client,
    ):
        progress(f"gRPC floor: GetPlannerInfo, {FLOOR_CALLS} calls")
        floor = time_calls(client.info, FLOOR_CALLS, default_warmup(FLOOR_CALLS))
        for case in cases:
            calls, warmup = config.calls_for(case.size), config.warmup_for(case.size)
            for form, request in case.requests.items():
                if client.plan_rotation(request) != case.response:
                    raise AssertionError("the server answered differently than in process")
                progress(f"{case.level} {case.size}: gRPC {server.address} ({form}), {calls} calls")
                stats = time_calls(
                    partial(client.plan_rotation, request), calls, warmup, config.budget_s()
                )
                results.append(
                    CaseResult(
                        case.level, case.size, "grpc", form, stats, case.plan, request.ByteSize()
                    )
                )
    return results, floor


def run(config: RotationBenchConfig, progress: Progress | None = None) -> RotationRun:
    say: Progress = progress or (lambda _: None)
    cases = [
        build_case(n, config.seed, block_level, config.mix)
        for block_level, sizes in ((False, config.sizes), (True, config.block_level_sizes))
        for n in sizes
    ]
    results = [r for case in cases for r in _in_process(case, config, say)]
    floor = None
    if config.grpc and cases:
        over_grpc, floor = _over_grpc(cases, config, say)
        results += over_grpc
    return RotationRun(sorted(results, key=sort_key), floor)
