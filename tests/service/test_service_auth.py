"""The bearer token: calls without the right `authorization: Bearer <token>`
get UNAUTHENTICATED and change nothing; health checks stay open; a token is
refused off loopback without TLS; the server binds loopback by default."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from tls_certs import make_pki

from planner.bearer_token import TOKEN_ENV, AuthConfigError, read_token
from planner.cli import build_parser, main
from planner.client import PlannerClient, PlannerError, RetryPolicy
from planner.service.auth import is_loopback
from planner.service.server import PlannerServer, ServerConfig
from planner.tls import ClientTls, ServerTls
from planner.v1 import placement_pb2 as pb

TOKEN = "s3cret-token.for_tests"
NO_RETRY = RetryPolicy(max_attempts=1)
OFFER = "PlacementService.OfferMemory"
STATUS = "PlacementService.GetPoolStatus"


@pytest.fixture(scope="module")
def server() -> Iterator[PlannerServer]:
    s = PlannerServer(ServerConfig(port=0, store_path=":memory:", auth_token=TOKEN))
    s.start()
    yield s
    s.stop(grace_s=1.0)


def offer(key: str) -> pb.OfferMemoryRequest:
    return pb.OfferMemoryRequest(pool_id="auth", idempotency_key=key, producer_id="g0", bytes=7)


def pool_status(server: PlannerServer) -> pb.GetPoolStatusResponse:
    with PlannerClient(server.address, deadline_s=5, auth_token=TOKEN) as client:
        status = client.call(STATUS, pb.GetPoolStatusRequest(pool_id="auth"))
    assert isinstance(status, pb.GetPoolStatusResponse)
    return status


@pytest.mark.parametrize(
    "metadata",
    [
        None,
        (("authorization", f"Bearer {TOKEN}x"),),
        (("authorization", f"Bearer {TOKEN[:-1]}"),),
        (("authorization", TOKEN),),
        (("authorization", f"bearer {TOKEN}"),),
        (("authorization", f"Basic {TOKEN}"),),
        (("x-token", f"Bearer {TOKEN}"),),
    ],
    ids=["none", "longer", "shorter", "no-scheme", "lowercase-scheme", "basic", "other-key"],
)
def test_wrong_or_missing_token_is_unauthenticated_and_changes_nothing(server, metadata):
    with grpc.insecure_channel(server.address) as channel:
        call = channel.unary_unary(
            "/planner.v1.PlacementService/OfferMemory",
            request_serializer=pb.OfferMemoryRequest.SerializeToString,
            response_deserializer=pb.OfferMemoryResponse.FromString,
        )
        with pytest.raises(grpc.RpcError) as err:
            call(offer("wrong"), timeout=5, metadata=metadata)
    assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert not pool_status(server).found


def test_right_token_is_served(server):
    with PlannerClient(server.address, deadline_s=5, auth_token=TOKEN) as client:
        answer = client.call(OFFER, offer("right"))
    assert isinstance(answer, pb.OfferMemoryResponse)
    assert answer.producer.offered_bytes == 7 and not answer.replayed
    assert pool_status(server).found


def test_planner_client_with_a_wrong_token(server):
    client = PlannerClient(server.address, deadline_s=5, retry=NO_RETRY, auth_token="nope")
    with client, pytest.raises(PlannerError) as err:
        client.info()
    assert err.value.code == grpc.StatusCode.UNAUTHENTICATED


def test_health_is_open_and_reflection_is_not(server):
    with grpc.insecure_channel(server.address) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        answer = health.Check(health_pb2.HealthCheckRequest(service=""), timeout=5)
        assert answer.status == health_pb2.HealthCheckResponse.SERVING
        reflection = reflection_pb2_grpc.ServerReflectionStub(channel)
        asks = iter([reflection_pb2.ServerReflectionRequest(list_services="")])
        with pytest.raises(grpc.RpcError) as err:
            list(reflection.ServerReflectionInfo(asks, timeout=5))
        assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
        metadata = (("authorization", f"Bearer {TOKEN}"),)
        asks = iter([reflection_pb2.ServerReflectionRequest(list_services="")])
        (listing,) = reflection.ServerReflectionInfo(asks, timeout=5, metadata=metadata)
        names = {s.name for s in listing.list_services_response.service}
        assert "planner.v1.PlacementService" in names


def test_planner_call_with_the_token(server, tmp_path, capsys, monkeypatch):
    request = tmp_path / "offer.json"
    request.write_text(
        json.dumps({"pool_id": "cli", "idempotency_key": "k", "producer_id": "g", "bytes": 5}),
        encoding="utf-8",
    )
    token_file = tmp_path / "token"
    token_file.write_text(f"{TOKEN}\n", encoding="utf-8")
    argv = ["call", OFFER, "--target", server.address, "--json", str(request)]
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    assert main(argv) == 1
    assert "UNAUTHENTICATED" in capsys.readouterr().err
    assert main([*argv, "--auth-token-file", str(token_file)]) == 0
    assert json.loads(capsys.readouterr().out)["producer"]["offered_bytes"] == "5"
    monkeypatch.setenv(TOKEN_ENV, TOKEN)
    assert main(argv) == 0
    assert json.loads(capsys.readouterr().out)["replayed"] is True
    token_file.write_text("", encoding="utf-8")
    assert main([*argv, "--auth-token-file", str(token_file)]) == 2
    assert f"--auth-token-file: {token_file} is empty" in capsys.readouterr().err


def test_token_over_tls(tmp_path):
    pki = make_pki(tmp_path)
    server = PlannerServer(
        ServerConfig(
            port=0,
            store_path=":memory:",
            tls=ServerTls(str(pki.server_cert), str(pki.server_key)),
            auth_token=TOKEN,
        )
    )
    server.start()
    try:
        tls = ClientTls(str(pki.ca))
        with PlannerClient(server.address, deadline_s=5, tls=tls, auth_token=TOKEN) as client:
            assert client.info().version
        tokenless = PlannerClient(server.address, deadline_s=5, retry=NO_RETRY, tls=tls)
        with tokenless, pytest.raises(PlannerError) as err:
            tokenless.info()
        assert err.value.code == grpc.StatusCode.UNAUTHENTICATED
    finally:
        server.stop(grace_s=1.0)


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "10.1.2.3", "planner.example"])
def test_a_token_off_loopback_needs_tls(host, tmp_path, capsys):
    with pytest.raises(AuthConfigError, match="needs TLS"):
        ServerConfig(host=host, auth_token=TOKEN)
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN, encoding="utf-8")
    argv = ["serve", "--host", host, "--port", "0", "--auth-token-file", str(token_file)]
    assert main([*argv, "--store", ":memory:"]) == 2
    assert "needs TLS" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.8.9.1", True),
        ("::1", True),
        ("[::1]", True),
        ("localhost", True),
        ("0.0.0.0", False),
        ("::", False),
        ("example.org", False),
    ],
)
def test_is_loopback(host, loopback):
    assert is_loopback(host) == loopback


def test_read_token(tmp_path, monkeypatch):
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    assert read_token(None) is None
    monkeypatch.setenv(TOKEN_ENV, "")
    with pytest.raises(AuthConfigError, match="set but empty"):
        read_token(None)
    monkeypatch.setenv(TOKEN_ENV, f" {TOKEN}\n")
    assert read_token(None) == TOKEN
    path = tmp_path / "t"
    path.write_text(f"  {TOKEN}\n", encoding="utf-8")
    assert read_token(str(path)) == TOKEN
    path.write_text("two words", encoding="utf-8")
    with pytest.raises(AuthConfigError, match="without whitespace"):
        read_token(str(path))
    with pytest.raises(AuthConfigError, match="cannot read"):
        read_token(str(tmp_path / "absent"))
    monkeypatch.setenv(TOKEN_ENV, "a\tb")
    with pytest.raises(AuthConfigError, match=r"\$PLANNER_AUTH_TOKEN: the token must be printable"):
        read_token(None)


@pytest.mark.parametrize(
    ("value", "host"),
    [("", "0.0.0.0"), (" \n\t", "0.0.0.0"), ("", "127.0.0.1"), ("t\u00f6ken", "127.0.0.1")],
)
def test_an_empty_or_unusable_token_in_the_environment_is_refused_at_start(value, host):
    # A real process: a server that started anyway would run until the timeout.
    serve = ["serve", "--host", host, "--port", "0", "--store", ":memory:"]
    done = subprocess.run(
        [sys.executable, "-m", "planner.cli", *serve],
        env={**os.environ, TOKEN_ENV: value},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2, done.stdout
    assert "$PLANNER_AUTH_TOKEN" in done.stderr
    assert ("empty" if not value.strip() else "printable ASCII") in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize("value", ["t\u00f6ken", "\u30c8\u30fc\u30af\u30f3"])
def test_a_non_ascii_token_file_is_refused(value, tmp_path, capsys):
    token_file = tmp_path / "token"
    token_file.write_text(value, encoding="utf-8")
    argv = ["serve", "--port", "0", "--store", ":memory:", "--auth-token-file", str(token_file)]
    assert main(argv) == 2
    assert "--auth-token-file: the token must be printable ASCII" in capsys.readouterr().err
    with pytest.raises(AuthConfigError, match="printable ASCII"):
        ServerConfig(auth_token=value)
    with pytest.raises(AuthConfigError, match="empty"):
        ServerConfig(auth_token="")


def test_binds_loopback_by_default():
    assert ServerConfig().host == "127.0.0.1"
    args = build_parser().parse_args(["serve"])
    assert args.host == "127.0.0.1"
    server = PlannerServer(ServerConfig(port=0, store_path=":memory:"))
    try:
        assert server.address.startswith("127.0.0.1:")
    finally:
        server.stop(grace_s=0)
