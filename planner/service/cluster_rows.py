"""What a store backend implements to hold ClusterService's state
(DESIGN.md §3.3): one JSON document and revision per cluster, and the
answered calls of each cluster under their idempotency keys.

A change of one cluster runs in one `ClusterBackend.transact(cluster_id,
work)` transaction, isolated from every other change of that cluster until
it commits; the call's answer is recorded in the same transaction. A
backend may run `work` more than once (a server database retries a
transaction it could not serialize), so `work` keeps nothing outside the
transaction. Backends: SQLite (planner.service.cluster_sqlite), PostgreSQL
(planner.service.cluster_postgres).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, TypeVar

from planner.service.idempotency import RecordedCall

T = TypeVar("T")
State = dict[str, Any]


class ClusterTransaction(Protocol):
    def load(self) -> tuple[State | None, int]:
        """The cluster's state and revision (None, 0 when absent)."""
        ...

    def store(self, revision: int, state: State) -> None: ...

    def recorded(self, key: str) -> RecordedCall | None: ...

    def record(self, key: str, call: RecordedCall, revision: int, keep: int) -> None:
        """Records the answer, keeping the cluster's newest `keep` records."""
        ...


class ClusterBackend(Protocol):
    def transact(self, cluster_id: str, work: Callable[[ClusterTransaction], T]) -> T:
        """work(tx) in a transaction on cluster_id, committed when it returns,
        writing nothing when it raises. Store failures raise
        StoreUnavailableError."""
        ...

    def read(self, cluster_id: str, work: Callable[[ClusterTransaction], T]) -> T:
        """work(tx) in a read-only snapshot."""
        ...
