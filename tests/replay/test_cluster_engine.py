"""The cluster replay topology (planner.replay.cluster_engine): hand-checked
tiny cases, every request finishing once, memory never over capacity,
determinism, and KunServe's drop and restore on a burst."""

from __future__ import annotations

import csv
import itertools
from dataclasses import replace
from datetime import datetime
from pathlib import Path

import pytest

from planner.domain.requests import Slo
from planner.replay.cluster_engine import ClusterConfig, ClusterEngine, _round_time
from planner.replay.cluster_policies import CLUSTER_POLICY_NAMES, KUNSERVE, REPLICATION, STATIC_PP
from planner.replay.cluster_setup import ClusterKnobs, cluster_config
from planner.replay.metrics import summarize
from planner.replay.setup import ReplayKnobs, build_setup
from planner.trace.records import TraceRequest

TRACES = Path(__file__).resolve().parents[3] / "shared" / "traces"


class FlatCost:
    """Every non-empty iteration takes `step` seconds."""

    def __init__(self, step: float = 0.01) -> None:
        self.step = step

    def iteration_time_s(
        self,
        prefill_tokens: int,
        decode_tokens: int,
        attended_context_tokens: int,
        prefill_attention_pairs: int = 0,
    ) -> float:
        return self.step if prefill_tokens + decode_tokens else 0.0


def tiny_config(**kw: object) -> ClusterConfig:
    base = ClusterConfig(
        instances=2,
        kv_blocks_per_instance=8,
        block_size=16,
        kv_bytes_per_token=1000,
        param_bytes=64_000,  # 4 blocks
        num_layers=4,
        hidden_size=100,
        link_gbps=1.0,
        reload_gbps=1.0,
        slo=Slo(ttft_s=1.0, tbt_s=0.1),
    )
    return replace(base, **kw)  # type: ignore[arg-type]


def test_one_request_hand_checked() -> None:
    trace = [TraceRequest(arrival_s=0.0, prompt_tokens=16, output_tokens=3, id="a")]
    run = ClusterEngine(tiny_config(), REPLICATION, FlatCost(0.01), trace).run()
    (out,) = run.result.requests
    # Prefill at 0 emits the first token at 0.01, then one decode per 0.01 s.
    assert out.token_times_s == pytest.approx([0.01, 0.02, 0.03])
    assert out.finish_s == pytest.approx(0.03)
    assert run.stats.over_capacity == 0


def test_dispatcher_spreads_to_the_least_loaded() -> None:
    trace = [
        TraceRequest(arrival_s=0.0, prompt_tokens=40, output_tokens=2, id="a"),
        TraceRequest(arrival_s=0.0, prompt_tokens=40, output_tokens=2, id="b"),
    ]
    run = ClusterEngine(tiny_config(), REPLICATION, FlatCost(0.01), trace).run()
    # Two instances: both prefill in the first iteration, in parallel.
    assert [r.token_times_s[0] for r in run.result.requests] == pytest.approx([0.01, 0.01])


def test_static_pp_round_is_the_pipeline() -> None:
    # A lone request in a 2-stage group: 2 x (its iteration x 1/2 of the
    # layers) + one activation hop of its tokens.
    config = tiny_config(static_group_size=2)
    hop = 1 * config.hidden_size * 2 / config.link_bytes_per_s
    t = _round_time(FlatCost(0.01), config, 2, [(0, 1, 10, 0, 1)], (0.5, 0.5))
    assert t == pytest.approx(0.01 + hop)
    trace = [TraceRequest(arrival_s=0.0, prompt_tokens=16, output_tokens=2, id="a")]
    run = ClusterEngine(config, STATIC_PP, FlatCost(0.01), trace).run()
    (out,) = run.result.requests
    first = 0.01 + 16 * config.hidden_size * 2 / config.link_bytes_per_s
    assert out.token_times_s == pytest.approx([first, first + 0.01 + hop])


def test_too_long_requests_are_rejected_by_every_policy() -> None:
    trace = [
        TraceRequest(arrival_s=0.0, prompt_tokens=16, output_tokens=2, id="ok"),
        TraceRequest(arrival_s=0.0, prompt_tokens=200, output_tokens=2, id="huge"),
    ]
    for policy in CLUSTER_POLICY_NAMES:
        run = ClusterEngine(tiny_config(), policy, FlatCost(), trace).run()
        assert run.stats.rejected == 1
        assert [r.finish_s is not None for r in run.result.requests] == [True, False]


def burst_trace(n: int = 240) -> list[TraceRequest]:
    """A quiet phase, a 14x burst of long-output requests, then quiet."""
    out = []
    t = 0.0
    for i in range(n):
        rate = 28.0 if n // 4 <= i < n // 2 else 2.0
        t += 1.0 / rate
        out.append(
            TraceRequest(
                arrival_s=round(t, 6),
                prompt_tokens=200 + (i * 37) % 400,
                output_tokens=100 + (i * 53) % 300,
                id=f"r{i}",
            )
        )
    return out


@pytest.fixture(scope="module")
def small_cluster() -> tuple[ClusterConfig, object]:
    setup = build_setup("llama-3-8b@h100-sxm-80gb", ReplayKnobs(max_running=64))
    config = cluster_config(setup, ClusterKnobs(instances=4, kv_bytes_per_instance=int(1e9)))
    return config, setup.cost


@pytest.mark.parametrize("policy", CLUSTER_POLICY_NAMES)
def test_every_request_finishes_once_within_memory(
    policy: str, small_cluster: tuple[ClusterConfig, object]
) -> None:
    config, cost = small_cluster
    trace = burst_trace()
    run = ClusterEngine(config, policy, cost, trace).run()  # type: ignore[arg-type]
    assert run.stats.over_capacity == 0
    assert run.stats.rejected == 0
    for req, out in zip(trace, run.result.requests, strict=True):
        assert out.finish_s is not None
        assert len(out.token_times_s) == req.output_tokens
        assert out.token_times_s[0] > req.arrival_s
        assert all(b >= a for a, b in zip(out.token_times_s, out.token_times_s[1:], strict=False))
        assert out.finish_s == out.token_times_s[-1]
    for sample in run.result.timeline:
        assert sample.gpu_kv_blocks_used >= 0


def test_kunserve_drops_under_the_burst_and_restores_after(
    small_cluster: tuple[ClusterConfig, object],
) -> None:
    config, cost = small_cluster
    run = ClusterEngine(config, KUNSERVE, cost, burst_trace()).run()  # type: ignore[arg-type]
    assert run.stats.drops >= 1
    assert run.stats.groups_formed >= 1
    assert run.stats.restores >= 1
    assert run.stats.exchange_bytes > 0


def test_deterministic(small_cluster: tuple[ClusterConfig, object]) -> None:
    config, cost = small_cluster
    trace = burst_trace(120)
    for policy in (KUNSERVE, "kv-migration"):
        a = ClusterEngine(config, policy, cost, trace).run()  # type: ignore[arg-type]
        b = ClusterEngine(config, policy, cost, trace).run()  # type: ignore[arg-type]
        assert [r.token_times_s for r in a.result.requests] == [
            r.token_times_s for r in b.result.requests
        ]
        assert a.stats.events == b.stats.events


def test_config_rejects_nonsense() -> None:
    with pytest.raises(ValueError, match="instances"):
        tiny_config(instances=0)
    with pytest.raises(ValueError, match="static_group_size"):
        tiny_config(static_group_size=3)
    with pytest.raises(ValueError, match="link_gbps"):
        tiny_config(link_gbps=float("nan"))
    with pytest.raises(ValueError, match="unknown cluster policy"):
        ClusterEngine(tiny_config(), "llumnix", FlatCost(), [])


@pytest.mark.skipif(
    not (TRACES / "AzureLLMInferenceTrace_conv.csv").exists(), reason="no shared traces"
)
def test_azure_conversation_slice(small_cluster: tuple[ClusterConfig, object]) -> None:
    config, cost = small_cluster
    trace = []
    with (TRACES / "AzureLLMInferenceTrace_conv.csv").open(newline="") as f:
        rows = list(itertools.islice(csv.DictReader(f), 150))
    start = datetime.fromisoformat(rows[0]["TIMESTAMP"][:26])
    for i, row in enumerate(rows):
        at = (datetime.fromisoformat(row["TIMESTAMP"][:26]) - start).total_seconds()
        trace.append(
            TraceRequest(
                arrival_s=at * 10,  # 10x slower: a light slice
                prompt_tokens=int(row["ContextTokens"]),
                output_tokens=int(row["GeneratedTokens"]),
                id=str(i),
            )
        )
    run = ClusterEngine(config, KUNSERVE, cost, trace).run()  # type: ignore[arg-type]
    assert run.stats.over_capacity == 0
    done = sum(r.finish_s is not None for r in run.result.requests)
    assert done + run.stats.rejected == len(trace)


def test_kunserve_cuts_the_tail_of_a_memory_bound_burst() -> None:
    # 4 small KV regions (0.5 GB, ~3,800 tokens each) and a burst whose KV
    # needs several times that: replication queues behind full regions and
    # preempts; KunServe's drop adds 16 GB per merged pair.

    setup = build_setup("llama-3-8b@h100-sxm-80gb", ReplayKnobs(max_running=64))
    config = cluster_config(setup, ClusterKnobs(instances=4, kv_bytes_per_instance=int(0.5e9)))
    trace = []
    t = 0.0
    for i in range(120):
        t += 1.0 / (40.0 if 20 <= i < 100 else 2.0)
        trace.append(
            TraceRequest(
                arrival_s=round(t, 6),
                prompt_tokens=200 + (i * 37) % 200,
                output_tokens=300 + (i * 53) % 300,
                id=f"r{i}",
            )
        )
    p99 = {}
    for policy in (KUNSERVE, REPLICATION):
        run = ClusterEngine(config, policy, setup.cost, trace).run()
        assert run.stats.over_capacity == 0
        ttft = summarize(run.result).ttft_s.p99
        assert ttft is not None
        p99[policy] = ttft
        if policy == KUNSERVE:
            assert run.stats.drops >= 1 and run.stats.preemptions == 0
        else:
            assert run.stats.preemptions > 0
    assert p99[KUNSERVE] * 10 < p99[REPLICATION]
