"""Fuzzing every RPC of planner.rpc against one real server on loopback:
arbitrary messages built from each request's descriptor, one-field
mutations of a valid request, and mutated bytes of a serialized one. Every
call ends with a status other than INTERNAL/UNKNOWN within its deadline,
refusals name the field, refused calls leave stored state alone, and the
server answers every RPC's valid request afterwards. The RPCs that use the
durable store are fuzzed again against a server on PostgreSQL.

The default run is derandomized (the same examples on every run, so its
size and time are fixed by the settings) and reports a failing example as
found, without shrinking it against the live server (up to Hypothesis's
five minutes a test); the `slow` variants draw ten times as many new
examples each run and shrink."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator

import grpc
import pytest
from fuzz_calls import STATE_OF, assert_call_answered, assert_serving, call, call_raw
from google.protobuf.message import Message
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from message_strategies import byte_mutations, messages, mutations
from valid_requests import VALID

from planner.rpc import RPCS
from planner.service.limits import ServiceLimits
from planner.service.server import PlannerServer, ServerConfig

METHODS = list(RPCS)
# The RPCs that read or write the durable store.
STORE_METHODS = [
    m
    for m in METHODS
    if m.startswith("ClusterService.")
    or m.removeprefix("PlacementService.")
    in ("OfferMemory", "AllocateMemory", "FreeMemory", "ReclaimMemory", "GetPoolStatus")
]
FAST_EXAMPLES = 25
SLOW_EXAMPLES = 250
_suffixes = itertools.count()

Inputs = Callable[[str], st.SearchStrategy[bytes]]


def arbitrary(method: str) -> st.SearchStrategy[bytes]:
    return messages(RPCS[method].request_type.DESCRIPTOR).map(lambda m: m.SerializeToString())


def mutated(method: str) -> st.SearchStrategy[bytes]:
    return mutations(VALID[method]()).map(lambda p: p[1].SerializeToString())


def mutated_bytes(method: str) -> st.SearchStrategy[bytes]:
    return byte_mutations(VALID[method]())


INPUTS: dict[str, Inputs] = {
    "arbitrary": arbitrary,
    "mutated": mutated,
    "bytes": mutated_bytes,
}


@pytest.fixture(scope="module", autouse=True)
def seeded(channel: grpc.Channel) -> None:
    """Each RPC's valid request answered once, so that stored state (a pool,
    a cluster plan, a tuner) exists for the mutations to hit."""
    for method, build in VALID.items():
        code, detail = call(channel, method, build())
        assert code == grpc.StatusCode.OK, f"seed {method}: {code.name}: {detail}"


def fuzz(
    channel: grpc.Channel, method: str, inputs: Inputs, examples: int, *, explore: bool = False
) -> None:
    @settings(
        max_examples=examples,
        deadline=None,
        database=None,
        derandomize=not explore,
        phases=list(Phase) if explore else [Phase.explicit, Phase.generate],
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(inputs(method))
    def one_call(data: bytes) -> None:
        assert_call_answered(channel, method, data)

    one_call()
    assert_serving(channel, f"after-{method}-{next(_suffixes)}")


@pytest.mark.parametrize("kind", list(INPUTS))
@pytest.mark.parametrize("method", METHODS)
def test_fuzzed_calls_are_answered(channel, method, kind):
    fuzz(channel, method, INPUTS[kind], FAST_EXAMPLES)


@pytest.fixture(scope="module")
def postgresql_channel(postgresql) -> Iterator[grpc.Channel]:
    """A server whose store is a PostgreSQL database, seeded like `channel`'s."""
    server = PlannerServer(
        ServerConfig(host="127.0.0.1", port=0, store_path=postgresql.create_database())
    )
    server.start()
    with grpc.insecure_channel(server.address) as channel:
        for method, build in VALID.items():
            code, detail = call(channel, method, build())
            assert code == grpc.StatusCode.OK, f"seed {method}: {code.name}: {detail}"
        yield channel
    server.stop(grace_s=1.0)


@pytest.mark.parametrize("kind", list(INPUTS))
@pytest.mark.parametrize("method", STORE_METHODS)
def test_fuzzed_store_calls_are_answered_on_postgresql(postgresql_channel, method, kind):
    fuzz(postgresql_channel, method, INPUTS[kind], FAST_EXAMPLES)


@pytest.mark.slow
@pytest.mark.parametrize("kind", list(INPUTS))
@pytest.mark.parametrize("method", METHODS)
def test_fuzzed_calls_are_answered_many(channel, method, kind):
    fuzz(channel, method, INPUTS[kind], SLOW_EXAMPLES, explore=True)


def _with_unknown_field(request: Message, size: int) -> bytes:
    """request's bytes plus field 1000 (length-delimited) of size bytes, which
    a parser would skip: only the size limit refuses it."""
    tag = bytes([0xC2, 0x3E])  # (1000 << 3) | 2 as a varint
    length = bytearray()
    n = size
    while n >= 0x80:
        length.append((n & 0x7F) | 0x80)
        n >>= 7
    length.append(n)
    return request.SerializeToString() + tag + bytes(length) + b"\0" * size


@pytest.mark.parametrize("method", METHODS)
def test_oversized_message_is_resource_exhausted(start_server, method):
    limit = 64 * 1024
    server = start_server(limits=ServiceLimits(max_message_bytes=limit))
    with grpc.insecure_channel(server.address) as channel:
        code, _ = call_raw(channel, method, _with_unknown_field(VALID[method](), limit + 1))
        assert code == grpc.StatusCode.RESOURCE_EXHAUSTED
        # Under the limit the same padding is skipped by the parser.
        code, detail = call_raw(channel, method, _with_unknown_field(VALID[method](), 16))
        assert code not in {grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.INTERNAL}, detail
        assert_serving(channel, "after-oversized")


@pytest.mark.parametrize(
    ("method", "change"),
    [
        ("PlacementService.OfferMemory", lambda m: setattr(m, "idempotency_key", "o-new")),
        ("ClusterService.PlanBuddyGroups", lambda m: setattr(m.instances[0], "kv_demand_bytes", 1)),
        ("ServerlessService.ReportKnobFeedback", lambda m: setattr(m, "now_s", 9.0)),
    ],
)
def test_the_state_check_sees_an_accepted_change(channel, method, change):
    """The before/after comparison of assert_call_answered is not vacuous:
    an accepted change of each service's stored state shows in it."""
    read_state = STATE_OF[method]
    before = read_state(channel)
    request = VALID[method]()
    change(request)
    code, detail = call(channel, method, request)
    assert code == grpc.StatusCode.OK, detail
    assert read_state(channel) != before
