"""What the adapter shows inside vLLM: its counters and call latencies reach
vLLM's metrics through the KV connector stats path (the same numbers as the
scheduler's own counters and the swap ledger), one INFO line with its
settings when the scheduler starts, a startup error for the connector
without PlannerScheduler, and a scheduler that matches vLLM's async
setting."""

from __future__ import annotations

import copy
import functools
import logging

import pytest

from . import SKIP_REASON

pytest.importorskip("vllm", reason=SKIP_REASON)

from planner.adapters.vllm.connector import PlannerSwapConnector
from planner.adapters.vllm.plugin import LOGGER_NAME
from planner.adapters.vllm.scheduler import (
    PlannerScheduler,
    PlannerSchedulerBase,
    PlannerSyncScheduler,
)
from planner.adapters.vllm.stats import PlannerStats
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole

from .harness import make_scheduler

pytestmark = pytest.mark.engines

SLO = {"slo_ttft_s": 0.2, "slo_tbt_s": 0.1}


def _load(run, n=6):
    for i in range(n):
        run.add(f"r{i}", 40, 40)


def test_counters_reach_vllm_metrics_through_connector_stats(engine):
    # vLLM's own preemptions swapped too, so that swaps are counted.
    run = engine({"deadline_ms": 10_000, "engine_preemptions": "swap", **SLO})
    _load(run)
    run.run()
    counters = run.scheduler.planner_counters.snapshot()
    ledger = run.scheduler.connector.ledger
    assert counters.calls > 0 and ledger.swap_outs > 0
    # What the steps carried to the front end adds up to the totals.
    total = PlannerStats()
    for data in run.connector_stats:
        total.aggregate(PlannerSwapConnector.build_kv_connector_stats(data))
    assert total.data["calls"] == counters.calls
    assert total.data["ok"] == counters.ok
    assert len(total.data["latency_s"]) == counters.calls
    assert sum(total.data["latency_s"]) == pytest.approx(counters.latency.total_s)
    assert (total.data["swap_outs"], total.data["swap_ins"]) == (ledger.swap_outs, ledger.swap_ins)
    # The front end's Prometheus logger records them with vLLM's labels.
    registry = CollectorRegistry()
    types = {t: functools.partial(t, registry=registry) for t in (Counter, Gauge, Histogram)}
    labels = {"model_name": "tiny", "engine": "0"}
    prom = PlannerSwapConnector.build_prom_metrics(
        run.scheduler.vllm_config, types, list(labels), {0: list(labels.values())}
    )
    for data in run.connector_stats:
        prom.observe(data, 0)
    sample = registry.get_sample_value
    assert sample("planner_adapter_calls_total", labels) == counters.calls
    assert sample("planner_adapter_answers_total", labels) == counters.ok
    assert sample("planner_adapter_call_duration_seconds_count", labels) == counters.calls
    assert sample("planner_swap_outs_total", labels) == ledger.swap_outs
    assert sample("planner_adapter_fallbacks_total", {**labels, "reason": "deadline"}) == 0


def test_one_info_line_with_the_settings(vllm_config, caplog):
    with caplog.at_level(logging.INFO, logger=LOGGER_NAME):
        scheduler = make_scheduler(vllm_config, {"deadline_ms": 7, **SLO})
    lines = [
        r.getMessage()
        for r in caplog.records
        if r.name == LOGGER_NAME and r.levelno == logging.INFO
    ]
    assert len(lines) == 1, lines
    line = lines[0]
    # vLLM's CPU platform turns async scheduling off.
    assert "planner adapter on: PlannerSyncScheduler" in line
    assert "in process (deadline 7.0 ms, pipelined)" in line
    assert "SLO TTFT 0.2 s TBT 0.1 s" in line
    assert "swap (64 CPU blocks; vLLM's own preemptions by recompute)" in line
    assert "256 tokens / 8 requests per step" in line
    scheduler.shutdown()


def test_the_connector_refuses_to_start_without_planner_scheduler(vllm_config, kv_cache_config):
    config = copy.deepcopy(vllm_config)
    config.scheduler_config.scheduler_cls = None
    with pytest.raises(ValueError, match=r"needs --scheduler-cls planner\.adapters\.vllm"):
        PlannerSwapConnector(config, KVConnectorRole.SCHEDULER, kv_cache_config)
    # The worker side has no scheduler to check.
    PlannerSwapConnector(config, KVConnectorRole.WORKER, kv_cache_config)


@pytest.mark.parametrize(
    ("async_scheduling", "expected"),
    [(True, PlannerScheduler), (False, PlannerSyncScheduler)],
    ids=["async", "sync"],
)
def test_scheduler_follows_vllms_async_setting(vllm_config, async_scheduling, expected):
    config = copy.deepcopy(vllm_config)
    config.scheduler_config.async_scheduling = async_scheduling
    scheduler = make_scheduler(config, {})
    assert type(scheduler) is expected
    assert isinstance(scheduler, PlannerSchedulerBase)
    scheduler.shutdown()
