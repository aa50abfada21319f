"""The adapter's numbers on vLLM's own /metrics, through vLLM's KV connector
stats path: each step the scheduler-side PlannerSwapConnector hands vLLM a
PlannerStats (get_kv_connector_stats) with what happened since the last one;
vLLM carries it to the front end inside SchedulerStats, where its Prometheus
logger records it in the metrics PlannerPromMetrics registers
(build_prom_metrics) and its log line prints reduce(). No extra process,
port or environment variable: the metrics sit beside vLLM's own, with its
model_name and engine labels.

Metrics: planner_adapter_calls_total, planner_adapter_answers_total,
planner_adapter_fallbacks_total{reason}, planner_adapter_call_duration_seconds
(histogram: sending a call to its end), planner_adapter_step_wait_seconds
(histogram: what a step waited for the planner; the whole call when it is
synchronous, usually nothing when it is pipelined), planner_swap_outs_total, planner_swap_ins_total,
planner_swap_refused_total (a preemption the CPU pool could not take: vLLM
recomputes that request)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from planner.adapters.common.counters import (
    LATENCY_BUCKETS_S,
    WAIT_BUCKETS_S,
    FallbackCounters,
    FallbackReason,
)
from vllm.distributed.kv_transfer.kv_connector.v1.metrics import (
    KVConnectorPromMetrics,
    KVConnectorStats,
)
from vllm.v1.metrics.utils import create_metric_per_engine

from .swap_ledger import SwapLedger

_COUNTS = ("calls", "ok", "swap_outs", "swap_ins", "swap_refused")


def _empty() -> dict[str, Any]:
    return {
        **dict.fromkeys(_COUNTS, 0),
        "fallbacks": {r.value: 0 for r in FallbackReason},
        "latency_s": [],
        "wait_s": [],
    }


@dataclass
class PlannerStats(KVConnectorStats):  # type: ignore[misc, unused-ignore]
    """data: calls, ok (answers used), swap_outs, swap_ins, swap_refused
    (counts), fallbacks (count by reason), latency_s (each call's latency),
    wait_s (what each step waited for the planner)."""

    data: dict[str, Any] = field(default_factory=_empty)

    def reset(self) -> None:
        self.data = _empty()

    def aggregate(self, other: KVConnectorStats) -> PlannerStats:
        theirs = other.data
        for key in _COUNTS:
            self.data[key] += int(theirs.get(key, 0))
        for reason, n in theirs.get("fallbacks", {}).items():
            self.data["fallbacks"][reason] = self.data["fallbacks"].get(reason, 0) + int(n)
        self.data["latency_s"].extend(theirs.get("latency_s", ()))
        self.data["wait_s"].extend(theirs.get("wait_s", ()))
        return self

    def reduce(self) -> dict[str, int | float]:
        latency = self.data["latency_s"]
        wait = self.data["wait_s"]
        out: dict[str, int | float] = {
            "planner_calls": self.data["calls"],
            "planner_answers": self.data["ok"],
            "planner_fallbacks": sum(self.data["fallbacks"].values()),
            "planner_call_mean_ms": round(1e3 * sum(latency) / len(latency), 3) if latency else 0,
            "planner_call_max_ms": round(1e3 * max(latency), 3) if latency else 0,
            "planner_wait_mean_ms": round(1e3 * sum(wait) / len(wait), 3) if wait else 0,
            "swap_outs": self.data["swap_outs"],
            "swap_ins": self.data["swap_ins"],
            "swap_refused": self.data["swap_refused"],
        }
        return out

    def is_empty(self) -> bool:
        return not any(self.data[key] for key in _COUNTS)


class StatsTaker:
    """Scheduler side: what the planner link and the swap ledger did since
    the last take()."""

    def __init__(self, ledger: SwapLedger) -> None:
        self.ledger = ledger
        # Set by PlannerScheduler; None until then (no planner calls).
        self.counters: FallbackCounters | None = None
        self._last = (0, 0, dict.fromkeys(FallbackReason, 0), 0, 0, 0)

    def take(self) -> PlannerStats | None:
        snap = self.counters.snapshot() if self.counters is not None else None
        now = (
            snap.calls if snap else 0,
            snap.ok if snap else 0,
            dict(snap.fallbacks) if snap else dict.fromkeys(FallbackReason, 0),
            self.ledger.swap_outs,
            self.ledger.swap_ins,
            self.ledger.refused,
        )
        calls, ok, fallbacks, outs, ins, refused = now
        last_calls, last_ok, last_fallbacks, last_outs, last_ins, last_refused = self._last
        self._last = now
        if (calls, ok, outs, ins, refused) == (
            last_calls,
            last_ok,
            last_outs,
            last_ins,
            last_refused,
        ):
            # Nothing counted since the last take: no stats (vLLM is handed
            # none), and the latencies recorded meanwhile go as they would
            # with empty stats.
            if self.counters is not None:
                self.counters.drain_latencies()
                self.counters.drain_waits()
            return None
        stats = PlannerStats()
        stats.data.update(
            calls=calls - last_calls,
            ok=ok - last_ok,
            swap_outs=outs - last_outs,
            swap_ins=ins - last_ins,
            swap_refused=refused - last_refused,
            fallbacks={r.value: fallbacks[r] - last_fallbacks[r] for r in FallbackReason},
            latency_s=self.counters.drain_latencies() if self.counters is not None else [],
            wait_s=self.counters.drain_waits() if self.counters is not None else [],
        )
        return None if stats.is_empty() else stats


class PlannerPromMetrics(KVConnectorPromMetrics):  # type: ignore[misc, unused-ignore]
    def __init__(
        self,
        vllm_config: Any,
        metric_types: dict[type, type],
        labelnames: list[str],
        per_engine_labelvalues: dict[int, list[object]],
    ) -> None:
        super().__init__(vllm_config, metric_types, labelnames, per_engine_labelvalues)

        def counter(name: str, doc: str) -> dict[int, Any]:
            metric = self._counter_cls(name=name, documentation=doc, labelnames=labelnames)
            return create_metric_per_engine(metric, per_engine_labelvalues)  # type: ignore[no-any-return]

        self.calls = counter("planner_adapter_calls", "Planner calls made by the vLLM adapter.")
        self.ok = counter(
            "planner_adapter_answers", "Planner calls answered in time with a usable plan."
        )
        self.swap_outs = counter(
            "planner_swap_outs", "Preempted requests whose KV was copied to CPU memory."
        )
        self.swap_ins = counter("planner_swap_ins", "Requests whose KV was copied back to GPU.")
        self.swap_refused = counter(
            "planner_swap_refused",
            "Preemptions the CPU pool could not take (vLLM recomputes those requests).",
        )
        fallbacks = self._counter_cls(
            name="planner_adapter_fallbacks",
            documentation="Engine steps that ran vLLM's own policy instead, by reason.",
            labelnames=[*labelnames, "reason"],
        )
        self.fallbacks = {
            engine: {r.value: fallbacks.labels(*values, r.value) for r in FallbackReason}
            for engine, values in per_engine_labelvalues.items()
        }
        latency = self._histogram_cls(
            name="planner_adapter_call_duration_seconds",
            documentation="Time of one planner call as the adapter saw it.",
            buckets=list(LATENCY_BUCKETS_S),
            labelnames=labelnames,
        )
        self.latency = create_metric_per_engine(latency, per_engine_labelvalues)
        wait = self._histogram_cls(
            name="planner_adapter_step_wait_seconds",
            documentation="Time an engine step waited for a planner answer.",
            buckets=list(WAIT_BUCKETS_S),
            labelnames=labelnames,
        )
        self.wait = create_metric_per_engine(wait, per_engine_labelvalues)

    def observe(self, transfer_stats_data: dict[str, Any], engine_idx: int = 0) -> None:
        data = transfer_stats_data
        for name in _COUNTS:
            n = int(data.get(name, 0))
            if n:
                getattr(self, name)[engine_idx].inc(n)
        for reason, n in data.get("fallbacks", {}).items():
            if n and reason in self.fallbacks[engine_idx]:
                self.fallbacks[engine_idx][reason].inc(n)
        for seconds in data.get("latency_s", ()):
            self.latency[engine_idx].observe(seconds)
        for seconds in data.get("wait_s", ()):
            self.wait[engine_idx].observe(seconds)
