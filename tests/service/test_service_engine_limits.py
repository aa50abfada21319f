"""Snapshot.max_batched_tokens and max_running_requests: optional engine
limits that reach the policy's Snapshot as given, or as None when unset."""

from __future__ import annotations

from planner.service.convert.rotation import rotation_request_from_proto
from planner.service.limits import ServiceLimits


def test_engine_limits_reach_the_domain_snapshot(example_request):
    request = type(example_request)()
    request.CopyFrom(example_request)
    request.snapshot.max_batched_tokens = 2048
    request.snapshot.max_running_requests = 256
    snapshot, _ = rotation_request_from_proto(request, ServiceLimits())
    assert snapshot.max_batched_tokens == 2048
    assert snapshot.max_running_requests == 256


def test_unset_engine_limits_are_none(example_request):
    snapshot, _ = rotation_request_from_proto(example_request, ServiceLimits())
    assert snapshot.max_batched_tokens is None
    assert snapshot.max_running_requests is None
