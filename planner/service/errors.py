"""Errors the service answers with a status instead of a traceback."""

from __future__ import annotations


class InvalidArgumentError(ValueError):
    """Bad input, named by its field path (e.g. ``snapshot.requests[2].id``)."""

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"{field}: {reason}")
        self.field = field
        self.reason = reason


class FailedPreconditionError(ValueError):
    """A well-formed call the stored state does not allow (freeing a lease
    twice, reclaiming more than was lent): FAILED_PRECONDITION, nothing
    changed."""

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"{field}: {reason}")
        self.field = field
        self.reason = reason


class StoreUnavailableError(Exception):
    """The durable store cannot be written or read now (disk full, I/O error,
    locked by another process past the busy timeout): UNAVAILABLE with the
    reason, nothing changed; the call may be retried."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason
