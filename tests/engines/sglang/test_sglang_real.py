"""The plugin against SGLang's real code (engine tier: needs sglang
installed; read against 0.5.23).

On a CPU machine SGLang's scheduler modules do not import (its configs
import torchvision, whose PyPI wheels are CUDA builds), so:
- the hook targets' signatures are read from SGLang's source with ``ast``;
- SGLang's real ``HookRegistry`` (pure Python) applies the plugin's hooks to
  the recorded classes, which keep SGLang's method names and signatures;
- SGLang's real entry-point loader finds and runs the plugin."""

from __future__ import annotations

import ast
import importlib.util
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sglang_recorded
from planner.adapters.common.link import PlannerLink
from planner.adapters.sglang import plugin as sglang_plugin
from planner.adapters.sglang.plugin import PlannerScheduling
from sglang_recorded import NOW_S, ScheduleBatch, Scheduler

pytestmark = pytest.mark.engines

hook_registry = pytest.importorskip(
    "sglang.srt.plugins.hook_registry", reason="sglang is not installed (engine tier)"
)
sglang_plugins = pytest.importorskip("sglang.srt.plugins")

_BATCH = "sglang.srt.managers.schedule_batch.ScheduleBatch"
_SCHEDULER = "sglang.srt.managers.scheduler.Scheduler"
SIGNATURES = {
    sglang_plugin.NEXT_BATCH_TARGET: ["self", "running_batch", "last_batch"],
    sglang_plugin.CALC_PRIORITY_TARGET: [
        "self", "waiting_queue", "running_batch", "processed_tokens",
    ],
    sglang_plugin.RETRACTION_ORDER_TARGET: ["reqs"],
    sglang_plugin.UPDATE_RUNNING_TARGET: ["self", "batch"],
    f"{_BATCH}.release_req": ["self", "idx", "remaing_req_count", "offload_kv"],
    f"{_BATCH}.filter_batch": ["self", "reqs_to_exclude", "keep_indices"],
    f"{_SCHEDULER}._add_request_to_queue": ["self", "req", "is_retracted"],
}  # fmt: skip


def sglang_method(target: str) -> ast.FunctionDef:
    module, cls, name = target.rsplit(".", 2)
    spec = importlib.util.find_spec(module)
    assert spec is not None and spec.origin is not None, module
    tree = ast.parse(Path(spec.origin).read_text())
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == cls:
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name == name:
                    return item
    raise AssertionError(f"{target} not found in {spec.origin}")


@pytest.mark.parametrize(("target", "params"), SIGNATURES.items())
def test_hook_targets_have_the_recorded_signatures(target: str, params: list[str]) -> None:
    args = sglang_method(target).args
    assert [a.arg for a in args.args + args.kwonlyargs] == params


def test_retraction_order_is_a_staticmethod() -> None:
    method = sglang_method(sglang_plugin.RETRACTION_ORDER_TARGET)
    assert [d.id for d in method.decorator_list if isinstance(d, ast.Name)] == ["staticmethod"]


def recorded(target: str) -> str:
    """The same class and method, on the recorded structures."""
    cls, name = target.rsplit(".", 2)[-2:]
    return f"sglang_recorded.{cls}.{name}"


@pytest.fixture
def registry(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """SGLang's HookRegistry, emptied; the patched recorded classes and the
    registry's global state are put back afterwards."""
    real = hook_registry.HookRegistry
    for cls, name in (
        (sglang_recorded.Scheduler, "get_next_batch_to_run"),
        (sglang_recorded.Scheduler, "update_running_batch"),
        (sglang_recorded.SchedulePolicy, "calc_priority"),
        (sglang_recorded.ScheduleBatch, "_get_decode_retraction_order"),
    ):
        monkeypatch.setattr(cls, name, cls.__dict__[name])
    saved_hooks, saved_patched = dict(real._hooks), set(real._patched)
    real.reset()
    yield real
    real.reset()
    real._hooks.update(saved_hooks)
    real._patched.update(saved_patched)


def test_real_registry_runs_a_planned_step(
    registry: Any, scheduler: Scheduler, batch: ScheduleBatch
) -> None:
    plugin = PlannerScheduling(PlannerLink(deadline_s=30.0), clock=lambda: NOW_S)
    for hook in plugin.hooks():
        registry.register(recorded(hook.target), hook.fn, hook_registry.HookType[hook.kind])
    registry.apply_hooks()
    raw = ScheduleBatch.__dict__["_get_decode_retraction_order"]
    assert isinstance(raw, staticmethod) and raw.__func__.__wrapped__ is not None
    r_old, r_new = batch.reqs
    # No step in progress: SGLang's order (fewest output tokens retracted first).
    assert ScheduleBatch._get_decode_retraction_order([r_old, r_new]) == [0, 1]

    result = scheduler.get_next_batch_to_run(batch, None)

    assert result is batch
    assert [r.rid for r in batch.reqs] == ["r-new"]
    assert [r.rid for r in scheduler.waiting_queue] == ["w-late", "w-fresh", "r-old"]
    assert plugin.actions is None
    assert plugin.link.counters.snapshot().ok == 1


def test_sglang_loader_finds_and_runs_the_entry_point(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SGLANG_PLUGINS", "planner")
    plugins = sglang_plugins.load_plugins_by_group(sglang_plugins.GENERAL_PLUGINS_GROUP)
    if "planner" not in plugins:
        pytest.skip("planner is not pip-installed in this environment (no entry point)")
    register, _dist = plugins["planner"]
    assert register is sglang_plugin.register
    registry = hook_registry.HookRegistry
    saved = {k: list(v) for k, v in registry._hooks.items()}
    try:
        register()
        targets = {t for t, hooks in registry._hooks.items() if t not in saved or hooks != saved[t]}
    finally:
        registry._hooks.clear()
        registry._hooks.update(saved)
    assert targets == {
        sglang_plugin.NEXT_BATCH_TARGET,
        sglang_plugin.CALC_PRIORITY_TARGET,
        sglang_plugin.RETRACTION_ORDER_TARGET,
        sglang_plugin.UPDATE_RUNNING_TARGET,
    }
