"""The planner replicas a client talks to: one target as gRPC takes it
("host:port", or any gRPC target URI), or several "host:port" targets (a
list, or one string with commas) that the client balances across.

Several targets are resolved to their addresses when the client is made (a
name with several addresses counts each as a replica), so that one gRPC
channel can balance over all of them with its round_robin policy: a
replica that goes away (or is restarted at the same address) is skipped
until it is back. A replica that moves to a new address needs a new client.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Sequence
from dataclasses import dataclass


class TargetError(ValueError):
    pass


def split_targets(target: str | Sequence[str]) -> tuple[str, ...]:
    """The targets, in order, each stripped; a comma separates them."""
    items = target.split(",") if isinstance(target, str) else list(target)
    targets = tuple(t.strip() for t in items if t.strip())
    if not targets:
        raise TargetError("no planner target given")
    duplicates = sorted({t for t in targets if targets.count(t) > 1})
    if duplicates:
        raise TargetError(f"target {duplicates[0]!r} is given twice")
    return targets


def host_and_port(target: str) -> tuple[str, int]:
    """("host", port) of "host:port" or "[v6 address]:port"."""
    if "://" in target or target.startswith(("dns:", "ipv4:", "ipv6:", "unix:")):
        raise TargetError(
            f"{target!r}: with several targets, each must be host:port (no URI scheme)"
        )
    host, sep, port_text = target.rpartition(":")
    if not sep or not host:
        raise TargetError(f"{target!r} is not host:port")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    elif ":" in host:
        raise TargetError(f"{target!r}: write an IPv6 address in brackets, [addr]:port")
    try:
        port = int(port_text)
    except ValueError:
        raise TargetError(f"{target!r}: port {port_text!r} is not a number") from None
    if not 0 < port < 65536:
        raise TargetError(f"{target!r}: port {port} is out of range")
    return host, port


@dataclass(frozen=True, slots=True)
class Replicas:
    """Several targets, resolved: the addresses ("ip:port", "[ip6]:port"),
    one per replica, in a stable order, all of one IP family."""

    targets: tuple[str, ...]
    addresses: tuple[str, ...]
    family: int

    @property
    def first_host(self) -> str:
        """The first target's host: the name TLS checks certificates against."""
        return host_and_port(self.targets[0])[0]

    def channel_target(self, addresses: Sequence[str] | None = None) -> str:
        """A gRPC target naming these addresses (all, or those given, in order)."""
        scheme = "ipv4" if self.family == socket.AF_INET else "ipv6"
        return f"{scheme}:{','.join(addresses or self.addresses)}"


def resolve(targets: Sequence[str]) -> Replicas:
    """Each target's addresses. IPv4 when every target has one, else IPv6 when
    every target has one (a gRPC channel balances over one family)."""
    by_family: dict[int, list[str]] = {socket.AF_INET: [], socket.AF_INET6: []}
    complete: dict[int, bool] = {socket.AF_INET: True, socket.AF_INET6: True}
    for target in targets:
        host, port = host_and_port(target)
        found = _addresses(host, port, target)
        for family, known in by_family.items():
            mine = found.get(family, [])
            complete[family] = complete[family] and bool(mine)
            known.extend(a for a in mine if a not in known)
    for family in (socket.AF_INET, socket.AF_INET6):
        if complete[family]:
            return Replicas(tuple(targets), tuple(by_family[family]), family)
    raise TargetError(
        f"targets {', '.join(targets)} share no IP family (all IPv4 or all IPv6 addresses "
        "are needed to balance across them)"
    )


def _addresses(host: str, port: int, target: str) -> dict[int, list[str]]:
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        ip = None
    if ip is not None:
        family = socket.AF_INET if ip.version == 4 else socket.AF_INET6
        return {family: [_address(str(ip), port, family)]}
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError as exc:
        raise TargetError(f"{target!r}: cannot resolve {host!r}: {exc}") from None
    found: dict[int, list[str]] = {}
    for family, _, _, _, sockaddr in infos:
        if family not in (socket.AF_INET, socket.AF_INET6):
            continue
        address = _address(str(sockaddr[0]), port, family)
        if address not in found.setdefault(family, []):
            found[family].append(address)
    return found


def _address(ip: str, port: int, family: int) -> str:
    return f"{ip}:{port}" if family == socket.AF_INET else f"[{ip}]:{port}"
