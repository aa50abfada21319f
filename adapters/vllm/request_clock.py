"""Times vLLM does not keep per request: when it last entered the running
state, and when it produced its first and its latest token. Plain Python,
no vLLM."""

from __future__ import annotations

from collections.abc import Iterable


class RequestClock:
    def __init__(self) -> None:
        self._run_start_s: dict[str, float] = {}
        self._last_token_s: dict[str, float] = {}
        self._first_token_s: dict[str, float] = {}

    def mark_running(self, running_ids: Iterable[str], now_s: float) -> None:
        """After a step is scheduled: requests newly running start their run
        now; those no longer running lose their run start."""
        running = set(running_ids)
        for rid in running:
            self._run_start_s.setdefault(rid, now_s)
        for rid in [r for r in self._run_start_s if r not in running]:
            del self._run_start_s[rid]

    def mark_tokens(self, request_ids: Iterable[str], now_s: float) -> None:
        for rid in request_ids:
            self._last_token_s[rid] = now_s
            self._first_token_s.setdefault(rid, now_s)

    def forget(self, live_ids: Iterable[str]) -> None:
        """Drop every request not in live_ids (finished or aborted)."""
        live = set(live_ids)
        for table in (self._run_start_s, self._last_token_s, self._first_token_s):
            for rid in [r for r in table if r not in live]:
                del table[rid]

    def run_start_s(self, request_id: str) -> float | None:
        return self._run_start_s.get(request_id)

    def last_token_s(self, request_id: str) -> float | None:
        return self._last_token_s.get(request_id)

    def first_token_s(self, request_id: str) -> float | None:
        return self._first_token_s.get(request_id)
