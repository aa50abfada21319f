"""Bounds the service enforces on every call."""

from __future__ import annotations

from dataclasses import dataclass

# A block count larger than this is not a GPU or CPU pool anyone has; it also
# keeps every sum of counts far from int64 overflow.
MAX_BLOCKS = 1 << 31
MAX_BLOCK_SIZE_TOKENS = 1 << 16
MAX_ID_LENGTH = 256


@dataclass(frozen=True, slots=True)
class ServiceLimits:
    max_requests_per_snapshot: int = 100_000
    max_block_ids_per_snapshot: int = 4_000_000
    max_message_bytes: int = 64 * 1024 * 1024
    max_workers: int = 8
    # Calls queued or running at once; beyond it the server answers
    # RESOURCE_EXHAUSTED at once instead of queueing without bound. Twice the
    # 64 engines one server is sized for: gRPC frees a slot only after the
    # response went out, so an engine calling again at once can still be
    # counted (tests/service/test_service_load.py).
    max_concurrent_rpcs: int = 128
    # Open grpc.health.v1 Watch streams; more are refused with
    # RESOURCE_EXHAUSTED (Check stays open).
    max_health_watchers: int = 1024
    # Connections open at once, idle or not (lowered to what the file
    # descriptor limit allows); more are closed as soon as they are accepted.
    max_connections: int = 4096
    # A connection whose HTTP/2 (and TLS) handshake has not finished by then
    # is dropped: a socket that never sends a byte holds a descriptor that
    # long at most.
    handshake_timeout_s: float = 10.0
    # A connection with no call in flight for this long is closed (GOAWAY;
    # gRPC clients reconnect on their next call).
    connection_idle_s: float = 300.0
