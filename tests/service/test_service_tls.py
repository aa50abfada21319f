"""TLS and mutual TLS on real servers over loopback, with certificates made in
the test (tls_certs.make_pki): round trips, refused clients, and servers that
refuse to start on bad certificate files."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import grpc
import pytest
from tls_certs import Pki, make_pki

from planner.cli import main
from planner.client import PlannerClient, PlannerError, RetryPolicy
from planner.service.server import PlannerServer, ServerConfig
from planner.tls import ClientTls, ServerTls, TlsConfigError

NO_RETRY = RetryPolicy(max_attempts=1)
INFO = "PlannerInfoService.GetPlannerInfo"


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def other_pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    """A second CA, unrelated to pki's."""
    return make_pki(tmp_path_factory.mktemp("other"), ca_name="some other CA")


@pytest.fixture
def tls_server() -> Iterator[Callable[[ServerTls], PlannerServer]]:
    started: list[PlannerServer] = []

    def start(tls: ServerTls) -> PlannerServer:
        server = PlannerServer(ServerConfig(port=0, store_path=":memory:", tls=tls))
        server.start()
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop(grace_s=1.0)


def server_tls(pki: Pki, mutual: bool = False) -> ServerTls:
    return ServerTls(str(pki.server_cert), str(pki.server_key), str(pki.ca) if mutual else None)


def info_code(server: PlannerServer, tls: ClientTls | None) -> grpc.StatusCode:
    with PlannerClient(server.address, deadline_s=5, retry=NO_RETRY, tls=tls) as client:
        try:
            client.info()
        except PlannerError as exc:
            return exc.code
    return grpc.StatusCode.OK


def test_tls_round_trip(pki, tls_server):
    server = tls_server(server_tls(pki))
    with PlannerClient(server.address, deadline_s=5, tls=ClientTls(str(pki.ca))) as client:
        assert client.info().max_message_bytes == server.config.limits.max_message_bytes


def test_mutual_tls_across_several_replicas(pki, other_pki, tls_server):
    """Each replica's certificate names the first target's host (localhost);
    a client of another CA is refused by every replica."""
    servers = [tls_server(server_tls(pki, mutual=True)) for _ in range(2)]
    targets = [f"localhost:{s.port}" for s in servers]
    tls = ClientTls(str(pki.ca), str(pki.client_cert), str(pki.client_key))
    with PlannerClient(targets, deadline_s=5, tls=tls) as client:
        for _ in range(4):
            assert client.info().version
    stranger = ClientTls(str(other_pki.ca), str(other_pki.client_cert), str(other_pki.client_key))
    with PlannerClient(targets, deadline_s=2, retry=NO_RETRY, tls=stranger) as client:
        with pytest.raises(PlannerError) as refused:
            client.info()
        assert refused.value.code == grpc.StatusCode.UNAVAILABLE


def test_localhost_name_is_in_the_certificate(pki, tls_server):
    server = tls_server(server_tls(pki))
    with PlannerClient(
        f"localhost:{server.port}", deadline_s=5, tls=ClientTls(str(pki.ca))
    ) as client:
        assert client.info().version


def test_plaintext_client_against_tls_server_fails_cleanly(pki, tls_server):
    server = tls_server(server_tls(pki))
    assert info_code(server, None) == grpc.StatusCode.UNAVAILABLE
    # The server is unharmed: a TLS client still gets through.
    assert info_code(server, ClientTls(str(pki.ca))) == grpc.StatusCode.OK


def test_client_refuses_a_server_its_ca_did_not_sign(pki, other_pki, tls_server):
    server = tls_server(server_tls(pki))
    assert info_code(server, ClientTls(str(other_pki.ca))) == grpc.StatusCode.UNAVAILABLE


def test_mutual_tls_requires_a_client_certificate_from_the_ca(pki, other_pki, tls_server):
    server = tls_server(server_tls(pki, mutual=True))
    assert info_code(server, ClientTls(str(pki.ca))) == grpc.StatusCode.UNAVAILABLE
    stranger = ClientTls(str(pki.ca), str(other_pki.client_cert), str(other_pki.client_key))
    assert info_code(server, stranger) == grpc.StatusCode.UNAVAILABLE
    member = ClientTls(str(pki.ca), str(pki.client_cert), str(pki.client_key))
    assert info_code(server, member) == grpc.StatusCode.OK


@pytest.mark.parametrize(
    ("files", "message"),
    [
        (
            lambda p: (p.server_cert, p.server_key.with_name("absent.key"), None),
            "--tls-key: cannot read",
        ),
        (
            lambda p: (p.server_cert.with_name("absent.pem"), p.server_key, None),
            "--tls-cert: cannot read",
        ),
        (lambda p: (p.server_cert, p.client_key, None), "is not the private key of --tls-cert"),
        (lambda p: (p.server_key, p.server_key, None), "not a PEM certificate chain"),
        (
            lambda p: (p.server_cert, p.server_key, p.server_key),
            "--tls-client-ca: .* holds no PEM CA",
        ),
        (
            lambda p: (p.server_cert, p.server_key, p.ca.with_name("x")),
            "--tls-client-ca: cannot read",
        ),
    ],
    ids=["missing-key", "missing-cert", "mismatched", "not-a-cert", "ca-not-a-cert", "missing-ca"],
)
def test_bad_certificate_files_stop_the_server_with_a_clear_error(pki, files, message):
    cert, key, ca = files(pki)
    tls = ServerTls(str(cert), str(key), None if ca is None else str(ca))
    with pytest.raises(TlsConfigError, match=message):
        PlannerServer(ServerConfig(port=0, store_path=":memory:", tls=tls))


def test_planner_serve_with_mismatched_key_exits_2_without_traceback(pki, capsys):
    """In process: main returning (not raising) is what keeps a traceback off stderr."""
    argv = ["serve", "--port", "0", "--store", ":memory:", "--tls-cert", str(pki.server_cert)]
    assert main([*argv, "--tls-key", str(pki.client_key)]) == 2
    out, err = capsys.readouterr()
    assert "is not the private key of --tls-cert" in err and out == ""


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--tls-cert", "c.pem"], "--tls-cert and --tls-key go together"),
        (["--tls-client-ca", "ca.pem"], "--tls-client-ca needs --tls-cert"),
    ],
)
def test_planner_serve_flag_combinations(argv, message, capsys):
    assert main(["serve", "--port", "0", "--store", ":memory:", *argv]) == 2
    assert message in capsys.readouterr().err


def test_planner_call_over_mutual_tls(pki, tls_server, capsys, tmp_path):
    server = tls_server(server_tls(pki, mutual=True))
    empty = tmp_path / "empty.json"
    empty.write_text("{}", encoding="utf-8")
    target = ["--target", server.address, "--json", str(empty), "--deadline-ms", "5000"]
    tls = ["--tls-ca", str(pki.ca), "--tls-cert", str(pki.client_cert)]
    assert main(["call", INFO, *target, *tls, "--tls-key", str(pki.client_key)]) == 0
    assert '"version"' in capsys.readouterr().out
    assert main(["call", INFO, *target, "--tls-ca", str(pki.ca)]) == 1
    assert "UNAVAILABLE" in capsys.readouterr().err
    assert main(["call", INFO, *target, *tls]) == 2
    assert "--tls-cert and --tls-key go together" in capsys.readouterr().err
    assert main(["call", INFO, "--json", str(empty), "--tls-ca", str(pki.ca)]) == 2
    assert "need --target" in capsys.readouterr().err
