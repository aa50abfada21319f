"""What identifies a state-changing call for its retries: the client's
idempotency key and a digest of everything else the call says. A retry
carries the same key and the same content; a new request under an old key
differs in its digest."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from google.protobuf.message import Message


def request_digest(method: str, request: Message) -> str:
    """SHA-256 of the method and every field of the request but
    idempotency_key (deterministic serialization)."""
    copy = type(request)()
    copy.CopyFrom(request)
    copy.ClearField("idempotency_key")
    h = hashlib.sha256(method.encode())
    h.update(b"\0")
    h.update(copy.SerializeToString(deterministic=True))
    return h.hexdigest()


@dataclass(frozen=True, slots=True)
class RecordedCall:
    """An answered call under its idempotency key: the method, a digest of
    the request's content, and the serialized answer."""

    method: str
    digest: str
    response: bytes


@dataclass(frozen=True, slots=True)
class KeyedCall:
    method: str
    key: str
    digest: str

    @classmethod
    def of(cls, method: str, key: str, request: Message) -> KeyedCall | None:
        """The identity of request (whose idempotency_key is key), or None
        when it carries no key: it applies every time."""
        if not key:
            return None
        return cls(method, key, request_digest(method, request))
