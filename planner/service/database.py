"""What every store database offers the services above it: the place it
names (a file, or a URL without its password), opening and closing, a
probe write, and listeners that hear when the store fails and when a write
succeeds again (the health service is one). SQLite:
planner.service.store; PostgreSQL: planner.service.postgres_database."""

from __future__ import annotations

import threading
from typing import Protocol


class StoreListener(Protocol):
    def store_failed(self, reason: str) -> None: ...

    def store_recovered(self) -> None: ...


class Database(Protocol):
    @property
    def path(self) -> str:
        """Where the store is, as messages and logs name it."""
        ...

    @property
    def durable(self) -> bool: ...

    def add_listener(self, listener: StoreListener) -> None: ...

    def open(self) -> None:
        """Raises OSError, naming the store, when it cannot be used."""
        ...

    def probe(self) -> None:
        """One small write transaction: raises StoreUnavailableError while
        the store cannot be written."""
        ...

    def close(self) -> None: ...


class Listeners:
    """The listeners of one database, told outside any lock of theirs."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._listeners: list[StoreListener] = []

    def add(self, listener: StoreListener) -> None:
        with self._lock:
            self._listeners.append(listener)

    def failed(self, reason: str) -> None:
        with self._lock:
            listeners = list(self._listeners)
        for listener in listeners:
            listener.store_failed(reason)

    def recovered(self) -> None:
        with self._lock:
            listeners = list(self._listeners)
        for listener in listeners:
            listener.store_recovered()
