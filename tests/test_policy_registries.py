"""Everything that lists policies reads the registries: `planner replay
--policy` choices and help, `planner profiles policies`, docs/policies.md,
GetPlannerInfo's served policies (tests/service), the solver backends."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from planner.solvers import (
    SOLVER_BACKENDS,
    Backend,
    Model,
    Status,
    UnsupportedModelError,
    available_backends,
    solve,
)

from planner.cli import main
from planner.in_process.service import service_handler
from planner.replay.policy_registries import TOPOLOGY_POLICIES, policy_table, served_policies
from planner.rpc import RPCS
from planner.v1 import info_pb2

DOCS = Path(__file__).resolve().parents[1] / "docs" / "policies.md"


def test_docs_table_is_the_registries() -> None:
    text = DOCS.read_text(encoding="utf-8")
    found = re.search(r"<!-- policy-table begin -->\n(.*)<!-- policy-table end -->", text, re.S)
    assert found is not None, "docs/policies.md lost its policy-table markers"
    assert found.group(1) == policy_table(), (
        "docs/policies.md is out of date; paste this between the markers:\n" + policy_table()
    )


def test_every_served_policy_names_a_real_rpc() -> None:
    served = [
        (topology, e.served_by)
        for topology, registry in TOPOLOGY_POLICIES.items()
        for e in registry.entries()
        if e.served_by
    ]
    assert served and all(rpc in RPCS for _, rpc in served)
    assert "rotation/lvf" in served_policies() and "offload/orbitflow" in served_policies()
    assert len(served_policies()) == len(served)


def test_replay_help_lists_every_registered_policy(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["replay", "--help"])
    # argparse wraps lines at spaces and hyphens: compare without whitespace.
    text = "".join(capsys.readouterr().out.split())
    for topology, registry in TOPOLOGY_POLICIES.items():
        assert f"--topology{topology}:{','.join(registry)};" in text


@pytest.mark.parametrize("topology", list(TOPOLOGY_POLICIES))
def test_unknown_policy_is_refused_naming_the_registered_ones(
    topology: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = tmp_path / "t.jsonl"
    trace.write_text('{"arrival_s": 0, "prompt_tokens": 10, "output_tokens": 2}\n')
    code = main(["replay", str(trace), "--topology", topology, "--policy", "nope", "--quiet"])
    err = capsys.readouterr().err
    assert code == 2
    known = ", ".join(TOPOLOGY_POLICIES[topology])
    assert f"unknown policy 'nope' for --topology {topology} (choose from {known})" in err


def test_profiles_policies_lists_the_registries(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["profiles", "policies", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [(p["topology"], p["policy"]) for p in doc["policies"]] == [
        (t, name) for t, registry in TOPOLOGY_POLICIES.items() for name in registry
    ]
    assert [b["backend"] for b in doc["solver_backends"]] == list(SOLVER_BACKENDS)
    present = {b["backend"] for b in doc["solver_backends"] if b["present"]}
    assert present == {str(b) for b in available_backends()}
    assert main(["profiles", "policies"]) == 0
    out = capsys.readouterr().out
    assert "orbitflow" in out and "kv-migration" in out and "exhaustive" in out


def test_listing_long_context_policies_imports_none_of_them() -> None:
    code = (
        "import sys, planner.replay.longctx_registry as r; "
        "names = r.LONGCTX_POLICY_NAMES; "
        "print('planner.replay.longctx_policies' in sys.modules, len(names))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert out.split() == ["False", "5"]


def test_every_solver_backend_is_registered_once_and_solve_refuses_the_non_model_one() -> None:
    assert sorted(SOLVER_BACKENDS) == sorted(str(b) for b in Backend)
    assert all(name == str(spec.backend) for name, spec in SOLVER_BACKENDS.items())
    m = Model()
    x = m.add_binaries(2)
    m.add_exactly_one_groups(x.reshape(1, 2))
    with pytest.raises(UnsupportedModelError, match="AssignmentProblem"):
        solve(m, time_limit_s=1.0, backend="bnb")
    assert solve(m, time_limit_s=1.0, backend="exhaustive").status is Status.OPTIMAL


def test_the_in_process_shim_lists_the_served_policies() -> None:
    handler = service_handler(5.0)
    info = handler(RPCS["PlannerInfoService.GetPlannerInfo"], info_pb2.GetPlannerInfoRequest())
    assert isinstance(info, info_pb2.GetPlannerInfoResponse)
    assert tuple(info.policies) == served_policies()
