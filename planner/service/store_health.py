"""Health of the services whose calls write the durable store: NOT_SERVING
while the store cannot be written, so load balancers stop sending them
calls that would fail, and SERVING again after the first write that
succeeds (a call's, or a probe's: a probe writes every `probe_interval_s`
while the store is failing, since a load balancer that believes the health
check sends no calls). Any store database (SQLite, PostgreSQL) tells it."""

from __future__ import annotations

import logging
import threading

from planner.service.database import Database
from planner.service.errors import StoreUnavailableError
from planner.service.health import NOT_SERVING, SERVING, HealthService
from planner.service.logs import LOGGER_NAME, log_event

PROBE_INTERVAL_S = 1.0


class StoreHealth:
    def __init__(
        self,
        db: Database,
        health: HealthService,
        services: tuple[str, ...],
        probe_interval_s: float = PROBE_INTERVAL_S,
    ) -> None:
        self._db = db
        self._health = health
        self._services = services
        self._probe_interval_s = probe_interval_s
        self._lock = threading.Lock()
        # Held while the health of the services is set, so that the last
        # status set is the current one.
        self._apply_lock = threading.Lock()
        self._failing = False
        self._reason = ""
        self._stop = threading.Event()
        self._prober: threading.Thread | None = None
        self._logger = logging.getLogger(LOGGER_NAME)
        db.add_listener(self)

    @property
    def failing(self) -> bool:
        with self._lock:
            return self._failing

    def store_failed(self, reason: str) -> None:
        with self._lock:
            self._reason = reason
            if self._failing:
                return
            self._failing = True
            if self._prober is None:
                self._prober = threading.Thread(target=self._probe, name="store-probe", daemon=True)
                self._prober.start()
        log_event(
            self._logger,
            logging.ERROR,
            "store failing",
            store=self._db.path,
            reason=reason,
            not_serving=self._services,
        )
        self._apply()

    def store_recovered(self) -> None:
        with self._lock:
            if not self._failing:
                return
            self._failing = False
        log_event(self._logger, logging.INFO, "store recovered", store=self._db.path)
        self._apply()

    def _apply(self) -> None:
        with self._apply_lock:
            status = NOT_SERVING if self.failing else SERVING
            for service in self._services:
                self._health.set(service, status)

    def _probe(self) -> None:
        while not self._stop.wait(self._probe_interval_s):
            with self._lock:
                if not self._failing:
                    self._prober = None
                    return
            try:
                self._db.probe()
            except StoreUnavailableError:
                continue

    def close(self) -> None:
        """Stops probing (before the store closes, so no probe reopens it)."""
        self._stop.set()
        with self._lock:
            prober = self._prober
        if prober is not None:
            prober.join(timeout=self._probe_interval_s + 1.0)
