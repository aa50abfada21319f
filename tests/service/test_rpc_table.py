"""The RPC table is the proto's: every method every .proto file declares,
with the messages it names, and nothing else."""

from __future__ import annotations

import re
from pathlib import Path

from planner.rpc import PACKAGE, RPCS

PROTO_DIR = Path(__file__).resolve().parents[2] / "proto" / "planner" / "v1"
SERVICE = re.compile(r"^service (\w+) \{(.*?)^\}", re.S | re.M)
METHOD = re.compile(r"rpc (\w+)\((\w+)\) returns \((\w+)\)")


def declared() -> dict[str, tuple[str, str]]:
    """Service.Method -> (request, response) as the .proto files write them."""
    out = {}
    for path in sorted(PROTO_DIR.glob("*.proto")):
        for service, body in SERVICE.findall(path.read_text(encoding="utf-8")):
            for method, request, response in METHOD.findall(body):
                out[f"{service}.{method}"] = (request, response)
    return out


def test_the_table_is_every_method_the_proto_declares():
    methods = declared()
    assert methods, "no rpc found under proto/planner/v1"
    assert set(RPCS) == set(methods)
    for name, rpc in RPCS.items():
        request, response = methods[name]
        assert rpc.request_type.DESCRIPTOR.full_name == f"{PACKAGE}.{request}"
        assert rpc.response_type.DESCRIPTOR.full_name == f"{PACKAGE}.{response}"
        assert rpc.full_path == f"/{PACKAGE}.{rpc.service}/{rpc.name}"
