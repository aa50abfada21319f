"""An adapter's channel to a secured `planner serve`: the bearer token and
mutual TLS reach a real server on loopback; a missing or wrong one is a
counted fallback, never an exception in the engine; bad settings stop the
engine at start with the setting named."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
from planner.adapters.common.counters import FallbackReason
from planner.adapters.common.link import PlannerLink
from planner.adapters.common.security import ChannelSecurity
from planner.adapters.common.snapshot import build_rotation_request
from planner.adapters.sglang.config import ConfigError, PluginConfig
from planner.adapters.vllm.settings import PlannerSettings

from planner.service.server import PlannerServer, ServerConfig
from planner.tls import ServerTls

TOKEN = "s3cret-token"
NOW_S = 100.0
DEADLINE_S = 10.0


def _tls_certs() -> ModuleType:
    """tests/service/tls_certs.py (makes a throwaway CA and certificates)."""
    path = Path(__file__).resolve().parents[2] / "service" / "tls_certs.py"
    spec = importlib.util.spec_from_file_location("planner_test_tls_certs", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory):
    return _tls_certs().make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def secured_server(pki) -> Iterator[PlannerServer]:
    tls = ServerTls(str(pki.server_cert), str(pki.server_key), str(pki.ca))
    server = PlannerServer(ServerConfig(port=0, tls=tls, auth_token=TOKEN))
    server.start()
    yield server
    server.stop(grace_s=1.0)


def _security(pki, token_file: Path | None) -> ChannelSecurity:
    return ChannelSecurity.from_settings(
        "127.0.0.1:1",
        tls_ca=str(pki.ca),
        tls_cert=str(pki.client_cert),
        tls_key=str(pki.client_key),
        auth_token_file=None if token_file is None else str(token_file),
        where="test",
    )


def test_link_with_mutual_tls_and_token_gets_plans(
    secured_server, pki, tmp_path, views, pools, monkeypatch
):
    monkeypatch.delenv("PLANNER_AUTH_TOKEN", raising=False)
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    security = _security(pki, token_file)
    with PlannerLink(secured_server.address, DEADLINE_S, security=security) as link:
        response = link.plan_rotation(build_rotation_request(views, pools, NOW_S))
    assert response is not None
    assert [d.id for d in response.plan.preempted] == ["r-old"]
    assert link.counters.snapshot().ok == 1


def test_link_without_the_token_falls_back_and_counts_it(
    secured_server, pki, views, pools, monkeypatch
):
    monkeypatch.delenv("PLANNER_AUTH_TOKEN", raising=False)
    security = _security(pki, None)
    assert security.auth_token is None
    with PlannerLink(secured_server.address, DEADLINE_S, security=security) as link:
        assert link.plan_rotation(build_rotation_request(views, pools, NOW_S)) is None
    snap = link.counters.snapshot()
    assert (snap.calls, snap.ok) == (1, 0)
    assert (snap.fallbacks[FallbackReason.ERROR], snap.total_fallbacks) == (1, 1)


def test_token_comes_from_the_environment(pki, monkeypatch):
    monkeypatch.setenv("PLANNER_AUTH_TOKEN", TOKEN)
    assert _security(pki, None).auth_token == TOKEN


def test_vllm_settings_build_the_security(pki, tmp_path, monkeypatch):
    monkeypatch.delenv("PLANNER_AUTH_TOKEN", raising=False)
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN)
    settings = PlannerSettings.from_additional_config(
        {
            "planner": {
                "target": "127.0.0.1:50051",
                "tls_ca": str(pki.ca),
                "auth_token_file": str(token_file),
            }
        }
    )
    assert settings.security.auth_token == TOKEN
    assert settings.security.tls is not None
    assert settings.security.tls.ca_path == str(pki.ca)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"tls_ca": "/nonexistent/ca.pem"}, "additional_config.planner: --tls-ca: cannot read"),
        ({"tls_ca": 3}, "additional_config.planner.tls_ca: must be a file path"),
        ({"auth_token_file": "/nonexistent/token"}, "additional_config.planner: --auth-token"),
    ],
)
def test_vllm_settings_name_what_is_wrong(extra, message):
    with pytest.raises(ValueError, match=message):
        PlannerSettings.from_additional_config({"planner": {"target": "h:1", **extra}})


def test_vllm_in_process_mode_refuses_tls_settings():
    with pytest.raises(ValueError, match="need a target"):
        PlannerSettings.from_additional_config({"planner": {"tls_ca": "ca.pem"}})


def test_in_process_mode_ignores_the_token_environment(monkeypatch):
    monkeypatch.setenv("PLANNER_AUTH_TOKEN", TOKEN)
    assert PlannerSettings.from_additional_config({"planner": {}}).security == ChannelSecurity()


def test_sglang_config_reads_the_security_variables(pki, monkeypatch):
    monkeypatch.delenv("PLANNER_AUTH_TOKEN", raising=False)
    config = PluginConfig.from_env(
        {
            "PLANNER_TARGET": "127.0.0.1:50051",
            "PLANNER_TLS_CA": str(pki.ca),
            "PLANNER_TLS_CERT": str(pki.client_cert),
            "PLANNER_TLS_KEY": str(pki.client_key),
        }
    )
    assert config.security.tls is not None
    assert config.security.tls.cert_path == str(pki.client_cert)
    with pytest.raises(ConfigError, match="PLANNER_TLS_CA"):
        PluginConfig.from_env(
            {"PLANNER_TARGET": "127.0.0.1:50051", "PLANNER_TLS_CA": "/nonexistent/ca.pem"}
        )
