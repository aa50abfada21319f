"""The planner's RPCs as the contract names them: service, method, message
types, read from the generated descriptors of proto/planner/v1 (the proto is
the one source of truth). Clients and the server both read this table; it
knows no handlers."""

from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType

from google.protobuf import message_factory
from google.protobuf.message import Message

from planner.v1 import (
    cluster_pb2,
    info_pb2,
    offload_pb2,
    placement_pb2,
    rotation_pb2,
    serverless_pb2,
)

PACKAGE = "planner.v1"


@dataclass(frozen=True, slots=True)
class Rpc:
    service: str
    name: str
    request_type: type[Message]
    response_type: type[Message]

    @property
    def short_name(self) -> str:
        """As on the command line: Service.Method."""
        return f"{self.service}.{self.name}"

    @property
    def full_service(self) -> str:
        return f"{PACKAGE}.{self.service}"

    @property
    def full_path(self) -> str:
        """As on the wire: /package.Service/Method."""
        return f"/{self.full_service}/{self.name}"


# The generated modules whose services the planner serves; every method of
# every service they declare is in the table, in declaration order.
SERVICE_MODULES: tuple[ModuleType, ...] = (
    rotation_pb2,
    offload_pb2,
    cluster_pb2,
    placement_pb2,
    serverless_pb2,
    info_pb2,
)


def _rpcs(modules: tuple[ModuleType, ...]) -> dict[str, Rpc]:
    """The RPC table the proto files declare (their descriptors), with the
    generated message classes."""
    table: dict[str, Rpc] = {}
    for module in modules:
        for service in module.DESCRIPTOR.services_by_name.values():
            if service.file.package != PACKAGE:
                raise ValueError(f"{service.full_name}: not in package {PACKAGE}")
            for method in service.methods:
                rpc = Rpc(
                    service.name,
                    method.name,
                    message_factory.GetMessageClass(method.input_type),
                    message_factory.GetMessageClass(method.output_type),
                )
                table[rpc.short_name] = rpc
    return table


RPCS: dict[str, Rpc] = _rpcs(SERVICE_MODULES)

SERVICE_NAMES = sorted({r.full_service for r in RPCS.values()})
