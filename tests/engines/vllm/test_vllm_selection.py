"""How `vllm serve` finds the adapter: the general plugin through its entry
point, the scheduler through --scheduler-cls (its qualified name), and the
connector through kv_connector_module_path (exercised by every scheduler the
other tests build)."""

from __future__ import annotations

import copy

import pytest

from . import SKIP_REASON

pytest.importorskip("vllm", reason=SKIP_REASON)


pytest.importorskip("vllm", reason="vLLM is not installed here (run `make test-engines`)")

from planner.adapters.vllm.plugin import register
from planner.adapters.vllm.scheduler import PlannerScheduler
from vllm.plugins import load_plugins_by_group

pytestmark = pytest.mark.engines


def test_vllm_loads_the_general_plugin():
    plugins = load_plugins_by_group("vllm.general_plugins")
    assert plugins["planner"] is register


def test_scheduler_cls_names_the_planner_scheduler(vllm_config):
    config = copy.deepcopy(vllm_config)
    config.scheduler_config.scheduler_cls = "planner.adapters.vllm.scheduler.PlannerScheduler"
    assert config.scheduler_config.get_scheduler_cls() is PlannerScheduler


def test_plugin_accepts_the_installed_vllm():
    assert register() is True
