"""Layer offload on vLLM's real V1 scheduler: PlannerScheduler asks the
planner (in process, and a real server on loopback) for layer-offload
plans of its decode batch, the connector fetches offloaded layers per layer
(the driver poisons every evicted GPU copy and checks every earlier token's
KV in every layer before each forward), every request still finishes
exactly once with all its tokens, and the workers' per-layer timings reach
the planner's adaptive controller through ReportStep. A dead planner leaves
every layer resident."""

from __future__ import annotations

import pytest

from . import SKIP_REASON

pytest.importorskip("vllm", reason=SKIP_REASON)

from planner.adapters.common.counters import FallbackReason

from .test_vllm_rotation import SLO, _assert_all_finished_once, _load

pytestmark = pytest.mark.engines

LAYERS = tuple(f"layers.{i}" for i in range(4))
# comp_l 1 ms hides 2 blocks per layer; the batch's KV (4 layers) exceeds
# 24 one-layer blocks once two 40-80-token requests decode together.
OFFLOAD = {
    "layer_compute_ms": 1.0,
    "link_blocks_per_s": 2000.0,
    "gpu_block_budget": 24,
    "num_cpu_blocks": 32,
    "deadline_ms": 10_000,
}
EWMA_WEIGHT = 0.5


@pytest.mark.parametrize("remote", [False, True], ids=["in-process", "grpc"])
def test_layer_offload_fetches_per_layer_and_reports_timings(engine, planner_server, remote):
    offload = {**OFFLOAD, "engine_id": f"vllm-{remote}"}
    settings = {"deadline_ms": 10_000, **SLO, "layer_offload": offload}
    if remote:
        settings["target"] = planner_server.address
    run = engine(settings, layers=LAYERS)
    _load(run)
    run.run()
    _assert_all_finished_once(run)
    planner = run.scheduler.layer_planner
    ledger = run.scheduler.connector.layer_ledger
    plans = planner.link.plan_counters.snapshot()
    reports = planner.link.report_counters.snapshot()
    assert plans.ok == plans.calls == planner.plans > 0
    assert reports.ok == reports.calls > 0
    # The plans offloaded something and the worker fetched it layer by layer
    # (the driver's KV checks passed on poisoned GPU copies).
    fetched = [sum(t.fetched_blocks) for t in run.worker_timings]
    assert sum(fetched) > 0
    assert all(len(t.compute_s) == len(LAYERS) for t in run.worker_timings)
    ledger.take_step()
    assert ledger.free_cpu_blocks == ledger.num_cpu_blocks
    # The controller's estimates moved by EWMA toward exactly the per-layer
    # compute times the worker measured (or stayed put): the timings reached
    # ReportStep.
    previous = [OFFLOAD["layer_compute_ms"] / 1e3] * len(LAYERS)
    moved = 0
    assert len(planner.reports) == reports.ok
    for request, response in planner.reports:
        estimate = list(response.layer_compute_s)
        observed = list(request.observed_layer_compute_s)
        refreshed = [
            (1 - EWMA_WEIGHT) * p + EWMA_WEIGHT * o for p, o in zip(previous, observed, strict=True)
        ]
        assert estimate in (previous, refreshed)
        moved += estimate != previous
        previous = estimate
    assert moved >= 1


def test_dead_planner_keeps_every_layer_resident(engine, dead_target):
    settings = {"target": dead_target, "deadline_ms": 1_000, **SLO}
    run = engine({**settings, "layer_offload": {**OFFLOAD, "deadline_ms": 1_000}}, layers=LAYERS)
    _load(run)
    run.run()
    _assert_all_finished_once(run)
    planner = run.scheduler.layer_planner
    plans = planner.link.plan_counters.snapshot()
    assert plans.calls > 0
    assert plans.ok == 0
    assert (
        plans.fallbacks[FallbackReason.UNAVAILABLE] + plans.fallbacks[FallbackReason.DEADLINE]
        == plans.calls
    )
    assert planner.plans == 0
    # Nothing was offloaded, fetched, or reported.
    assert all(sum(t.fetched_blocks) == 0 for t in run.worker_timings)
    assert planner.link.report_counters.snapshot().calls == 0


def test_layer_offload_needs_the_connector(vllm_config, engine):
    with pytest.raises(ValueError, match=r"planner\.layer_offload: needs PlannerSwapConnector"):
        engine({"layer_offload": OFFLOAD}, swap=False, layers=LAYERS)


def test_token_deposit_paces_tokens_and_loses_none(engine):
    run = engine({"deadline_ms": 10_000, **SLO, "layer_offload": OFFLOAD}, layers=LAYERS)
    _load(run)
    run.run()
    _assert_all_finished_once(run)
    counts = run.scheduler.output_deposit.counts
    assert counts.deposited > 0
    assert counts.max_balance >= 1
    assert counts.dropped == 0
    assert counts.released + counts.flushed == counts.deposited
    # Steps come every 50 ms and the TBT SLO is 100 ms: a deposited request
    # gets at most one token per step until its finish flushes the rest.
    held = {rid for _, rid, n, done in run.deliveries if n == 0 and not done}
    assert not held, "an output with no tokens reached the front end"
    finishes = [n for _, _, n, done in run.deliveries if done]
    assert max(finishes) > 1
    assert all(n <= 1 for _, _, n, done in run.deliveries if not done)


def test_without_token_deposit_every_token_goes_out_at_once(engine):
    offload = {**OFFLOAD, "token_deposit": False}
    run = engine({"deadline_ms": 10_000, **SLO, "layer_offload": offload}, layers=LAYERS)
    _load(run)
    run.run()
    _assert_all_finished_once(run)
    assert run.scheduler.output_deposit is None
    assert all(n == 1 for _, _, n, _ in run.deliveries)
