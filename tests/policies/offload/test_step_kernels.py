"""The compiled step kernels against the readable event model: the exact
latency is the same number, the relaxed-link latency never exceeds it and
equals it for one request (one fetch at a time is the best schedule)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planner.policies.offload import StepInputs
from planner.policies.offload.event_model import step_latency_s
from planner.policies.offload.step_kernels import (
    exact_latencies,
    exact_latency_of,
    pattern_layers,
    relaxed_latencies,
)


@st.composite
def steps(draw: st.DrawFn, max_requests: int = 5) -> StepInputs:
    layers = draw(st.integers(1, 12))
    requests = draw(st.integers(1, max_requests))
    comp = draw(
        st.lists(st.sampled_from([0.0, 0.5, 1.0, 2.0, 3.5]), min_size=layers, max_size=layers)
    )
    blocks = draw(st.lists(st.integers(0, 12), min_size=requests, max_size=requests))
    resident = draw(
        st.lists(
            st.lists(st.booleans(), min_size=layers, max_size=layers),
            min_size=requests,
            max_size=requests,
        )
    )
    bandwidth = draw(st.sampled_from([0.5, 1.0, 3.0, 7.0]))
    return StepInputs.of(comp, blocks, resident, bandwidth)


def _kernels(inputs: StepInputs) -> tuple[float, float]:
    layers_of, count = pattern_layers(~inputs.resident)
    rows = np.arange(inputs.num_requests, dtype=np.int64)
    args = (inputs.comp_s, inputs.bandwidth_blocks_per_s, inputs.kv_blocks, layers_of, count)
    exact = exact_latencies(*args, rows[None, :])
    relaxed = relaxed_latencies(*args, rows, rows[None, :], np.zeros(1))
    return float(exact[0]), float(relaxed[0])


@settings(max_examples=200, deadline=None)
@given(steps())
def test_exact_kernel_is_the_event_model(inputs: StepInputs) -> None:
    exact, _ = _kernels(inputs)
    reference = step_latency_s(inputs)
    assert exact == pytest.approx(reference, rel=1e-12, abs=1e-12)
    assert exact_latency_of(
        inputs.comp_s, inputs.bandwidth_blocks_per_s, inputs.kv_blocks, inputs.resident
    ) == pytest.approx(reference, rel=1e-12, abs=1e-12)


@settings(max_examples=200, deadline=None)
@given(steps())
def test_relaxed_link_is_a_lower_bound(inputs: StepInputs) -> None:
    exact, relaxed = _kernels(inputs)
    assert float(inputs.comp_s.sum()) - 1e-9 <= relaxed <= exact * (1 + 1e-12) + 1e-12


@settings(max_examples=100, deadline=None)
@given(steps(max_requests=1))
def test_relaxed_link_is_exact_for_one_request(inputs: StepInputs) -> None:
    exact, relaxed = _kernels(inputs)
    assert relaxed == pytest.approx(exact, rel=1e-12, abs=1e-12)


def test_extra_blocks_count_against_the_last_layer() -> None:
    # 2 layers of 1 s, nothing placed; 9 blocks at 3 per second must arrive
    # before layer 2 starts: 3 s, a stall of 2 s.
    layers_of, count = pattern_layers(np.zeros((1, 2), dtype=bool))
    out = relaxed_latencies(
        np.ones(2),
        3.0,
        np.zeros(1),
        layers_of,
        count,
        np.zeros(1, dtype=np.int64),
        np.zeros((1, 0), dtype=np.int64),
        np.array([9.0]),
    )
    assert out.tolist() == [4.0]
