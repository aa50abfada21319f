"""SGLang requests → engine-neutral views and the plugin's settings."""

from __future__ import annotations

import pytest
from planner.adapters.common.snapshot import ViewState
from planner.adapters.sglang.config import ConfigError, PluginConfig
from planner.adapters.sglang.snapshot import pool_sizes, request_views
from sglang_recorded import NOW_S, Req, ScheduleBatch, Scheduler, TimeStats


def test_running_and_waiting_requests_become_views(
    scheduler: Scheduler, batch: ScheduleBatch
) -> None:
    views = {v.request_id: v for v in request_views(batch.reqs, scheduler.waiting_queue, 16, NOW_S)}
    r_old = views["r-old"]
    assert (r_old.state, r_old.gpu_blocks, r_old.computed_tokens) == (ViewState.RUNNING, 8, 128)
    assert (r_old.arrival_s, r_old.run_start_s, r_old.last_token_s) == (40.0, 50.0, 99.9)
    w_late = views["w-late"]
    assert (w_late.state, w_late.prompt_tokens, w_late.gpu_blocks) == (ViewState.WAITING, 64, 0)
    assert (w_late.run_start_s, w_late.last_token_s) == (None, None)


def test_retracted_request_is_preempted_or_swapped() -> None:
    retracted = Req("x", list(range(20)), [1, 2, 3], TimeStats(95.0, 96.0, 97.0))
    (view,) = request_views([], [retracted], 16, NOW_S)
    assert (view.state, view.output_tokens, view.last_token_s) == (ViewState.PREEMPTED, 3, 97.0)
    (view,) = request_views([], [retracted], 16, NOW_S, host_blocks={"x": 2})
    assert (view.state, view.cpu_blocks) == (ViewState.SWAPPED, 2)


def test_unset_arrival_is_taken_as_now_and_duplicates_keep_running() -> None:
    req = Req("x", [1], time_stats=TimeStats())
    (view,) = request_views([req], [req], 16, NOW_S)
    assert (view.state, view.arrival_s) == (ViewState.RUNNING, NOW_S)


def test_stamps_after_now_are_clamped_to_now() -> None:
    req = Req("x", [1], [2], TimeStats(NOW_S + 1, NOW_S + 2, NOW_S + 3))
    (view,) = request_views([req], [], 16, NOW_S)
    assert (view.arrival_s, view.run_start_s, view.last_token_s) == (NOW_S, NOW_S, NOW_S)


def test_pool_sizes_count_whole_free_pages(scheduler: Scheduler) -> None:
    scheduler.token_to_kv_pool_allocator.free_tokens = 70
    pools = pool_sizes(scheduler)
    assert (pools.free_gpu_blocks, pools.block_size_tokens) == (4, 16)


def test_page_size_must_be_positive() -> None:
    with pytest.raises(ValueError, match="page_size must be > 0, got 0"):
        request_views([], [], 0, NOW_S)


def test_config_from_environment() -> None:
    config = PluginConfig.from_env({"PLANNER_TARGET": "10.0.0.1:50051", "PLANNER_DEADLINE_MS": "2"})
    assert (config.target, config.deadline_s, config.enabled) == ("10.0.0.1:50051", 0.002, True)
    assert PluginConfig.from_env({}) == PluginConfig(target=None, deadline_s=0.005, enabled=True)
    assert not PluginConfig.from_env({"PLANNER_SGLANG_DISABLE": "1"}).enabled


@pytest.mark.parametrize("raw", ["soon", "0", "-1", "nan"])
def test_bad_deadline_names_the_variable(raw: str) -> None:
    with pytest.raises(ConfigError, match="PLANNER_DEADLINE_MS"):
        PluginConfig.from_env({"PLANNER_DEADLINE_MS": raw})
