"""The adaptive controller's re-plan triggers and EWMA profile updates
(DESIGN.md §3.2; OrbitFlow §3.4 "Solver Invocations")."""

from __future__ import annotations

import json

import pytest

from planner.policies.offload import (
    AdaptiveController,
    ControllerConfig,
    ReplanReason,
    StepObservation,
)

IDS = ("a", "b")


def planned(fraction: float = 0.2, weight: float = 0.5) -> AdaptiveController:
    controller = AdaptiveController(
        comp_s=[0.010, 0.020],
        bandwidth_blocks_per_s=1000.0,
        config=ControllerConfig(mismatch_fraction=fraction, ewma_weight=weight),
    )
    controller.install_plan(IDS, predicted_step_s=0.100, expiry_step=10)
    return controller


def test_no_plan_yet() -> None:
    controller = AdaptiveController(comp_s=[0.01], bandwidth_blocks_per_s=1.0)
    decision = controller.observe(StepObservation(0, IDS, 0.1))
    assert decision.reason is ReplanReason.NO_PLAN
    assert decision.replan


def test_plan_holds() -> None:
    decision = planned().observe(StepObservation(3, ["b", "a"], 0.115))
    assert decision.reason is None
    assert not decision.replan
    assert decision.comp_s == (0.010, 0.020)
    assert not decision.profile_updated


def test_batch_change() -> None:
    controller = planned()
    assert controller.observe(StepObservation(3, ["a"], 0.1)).reasons == (
        ReplanReason.BATCH_CHANGE,
    )
    assert controller.observe(StepObservation(3, ["a", "b", "c"], 0.1)).reason is (
        ReplanReason.BATCH_CHANGE
    )
    controller.install_plan(["a", "b", "c"], 0.1, 20)
    assert controller.observe(StepObservation(4, ["c", "b", "a"], 0.1)).reason is None


def test_expiry() -> None:
    # The plan covers steps up to 9 (expiry_step 10 is the first it does not).
    controller = planned()
    assert controller.observe(StepObservation(8, IDS, 0.1)).reason is None
    assert controller.observe(StepObservation(9, IDS, 0.1)).reason is ReplanReason.EXPIRY


def test_mismatch_threshold_is_a_fraction_of_the_prediction() -> None:
    controller = planned(fraction=0.2)
    assert controller.observe(StepObservation(1, IDS, 0.120)).reason is None
    assert controller.observe(StepObservation(1, IDS, 0.080)).reason is None
    assert controller.observe(StepObservation(1, IDS, 0.121)).reason is (
        ReplanReason.PROFILE_MISMATCH
    )
    assert controller.observe(StepObservation(1, IDS, 0.079)).reason is (
        ReplanReason.PROFILE_MISMATCH
    )


def test_ewma_with_observed_layers_and_bandwidth() -> None:
    controller = planned(weight=0.25)
    decision = controller.observe(
        StepObservation(
            2,
            IDS,
            observed_step_s=0.150,
            layer_comp_s=[0.014, 0.016],
            bandwidth_blocks_per_s=600.0,
        )
    )
    assert decision.reason is ReplanReason.PROFILE_MISMATCH
    assert decision.profile_updated
    # 0.75 * 0.010 + 0.25 * 0.014; 0.75 * 0.020 + 0.25 * 0.016; 0.75 * 1000 + 0.25 * 600
    assert decision.comp_s == pytest.approx((0.011, 0.019))
    assert decision.bandwidth_blocks_per_s == pytest.approx(900.0)
    assert controller.comp_s == pytest.approx([0.011, 0.019])


def test_ewma_without_detail_scales_compute() -> None:
    # observed / predicted = 1.5; scale = 0.5 + 0.5 * 1.5 = 1.25.
    controller = planned(weight=0.5)
    decision = controller.observe(StepObservation(2, IDS, observed_step_s=0.150))
    assert decision.comp_s == pytest.approx((0.0125, 0.025))
    assert decision.bandwidth_blocks_per_s == 1000.0


def test_ewma_with_bandwidth_only_keeps_compute() -> None:
    controller = planned(weight=0.5)
    decision = controller.observe(StepObservation(2, IDS, 0.05, bandwidth_blocks_per_s=500.0))
    assert decision.comp_s == (0.010, 0.020)
    assert decision.bandwidth_blocks_per_s == 750.0


def test_no_update_without_mismatch() -> None:
    controller = planned()
    controller.observe(StepObservation(2, IDS, 0.1, layer_comp_s=[1.0, 1.0]))
    assert controller.comp_s == [0.010, 0.020]


def test_caller_prediction_overrides_the_plans() -> None:
    # The caller re-evaluated the plan for the grown KV: 0.13 predicted.
    controller = planned()
    assert controller.observe(StepObservation(5, IDS, 0.14, predicted_step_s=0.13)).reason is None


def test_all_reasons_in_order() -> None:
    decision = planned().observe(StepObservation(9, ["a"], 0.5))
    assert decision.reasons == (
        ReplanReason.BATCH_CHANGE,
        ReplanReason.PROFILE_MISMATCH,
        ReplanReason.EXPIRY,
    )
    assert decision.reason is ReplanReason.BATCH_CHANGE


def test_round_trip_through_json() -> None:
    controller = planned(fraction=0.3, weight=0.1)
    controller.observe(StepObservation(2, IDS, 0.5, layer_comp_s=[0.02, 0.03]))
    copy = AdaptiveController.from_dict(json.loads(json.dumps(controller.to_dict())))
    assert copy == controller
    fresh = AdaptiveController(comp_s=[0.1], bandwidth_blocks_per_s=2.0)
    assert AdaptiveController.from_dict(fresh.to_dict()) == fresh


def test_bad_configuration() -> None:
    with pytest.raises(ValueError):
        ControllerConfig(mismatch_fraction=-0.1)
    with pytest.raises(ValueError):
        ControllerConfig(ewma_weight=0.0)
    with pytest.raises(ValueError):
        planned().observe(StepObservation(1, IDS, 1.0, layer_comp_s=[0.1]))
