"""SLO-aware Token-Deposit (DESIGN.md §3.2; OrbitFlow §3.2).

Generated tokens go into a per-request FIFO instead of straight to the user.
While a request's deposit is non-empty exactly one token is released per TBT
SLO interval, each one SLO after the previous release. A violation becomes
visible only when the deposit is empty at a release time; the next token then
goes out as soon as it is generated and the SLO clock restarts from it. When
the request finishes the rest is released at once.

Release timing: a request's deposit is opened when its previous user-visible
token went out (normally the first token, which TTFT covers and which is not
deposited); that instant anchors the clock. So tokens generated at 0, 0.01 and
0.02 into a deposit opened at 0 with a 0.1 s SLO are released at 0.1, 0.2 and
0.3. A token generated exactly at a release time is released then, on time.

The object's whole state is explicit (to_dict / from_dict) and every method
takes the time; times must not go backwards.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt


@dataclass(frozen=True, slots=True)
class Release:
    """A token delivered to the user; flushed when it left in the burst at
    the request's finish rather than on the SLO schedule."""

    request_id: str
    token_id: int
    generated_s: float
    released_s: float
    flushed: bool = False


@dataclass(frozen=True, slots=True)
class Violation:
    """The deposit was empty at release time deadline_s: the user sees a gap
    longer than the SLO before the next token."""

    request_id: str
    deadline_s: float


@dataclass(frozen=True, slots=True)
class DepositEvents:
    releases: tuple[Release, ...] = ()
    violations: tuple[Violation, ...] = ()


@dataclass(slots=True)
class _Account:
    slo_tbt_s: float
    # Release times are anchor_s + n * slo_tbt_s (n = 1, 2, ...; no drift from
    # summing); the anchor moves to a token released late.
    anchor_s: float
    on_time: int = 0
    held: deque[tuple[int, float]] = field(default_factory=deque)
    released: int = 0
    violations: int = 0
    # The deposit was empty at the release time next_release_s
    # (counted once); the next token goes out when it is generated.
    missed: bool = False

    @property
    def next_release_s(self) -> float:
        return self.anchor_s + (self.on_time + 1) * self.slo_tbt_s


@dataclass(slots=True)
class TokenDeposit:
    """The Token-Deposits of all requests of one engine."""

    now_s: float = 0.0
    _accounts: dict[str, _Account] = field(default_factory=dict)

    def open(self, request_id: str, now_s: float, slo_tbt_s: float) -> None:
        """Start a request's deposit at the delivery of its previous visible
        token (now_s), with its TBT SLO."""
        if request_id in self._accounts:
            raise ValueError(f"deposit for request {request_id!r} is already open")
        if not slo_tbt_s > 0:
            raise ValueError(f"slo_tbt_s must be > 0, got {slo_tbt_s}")
        self._set_time(now_s)
        self._accounts[request_id] = _Account(slo_tbt_s=slo_tbt_s, anchor_s=now_s)

    def deposit(
        self,
        request_id: str,
        now_s: float,
        *,
        count: int = 1,
        token_ids: Sequence[int] | None = None,
    ) -> DepositEvents:
        """Add tokens generated at now_s (token_ids, else `count` tokens with
        id 0) and release whatever is due by now_s."""
        account = self._account(request_id)
        ids = list(token_ids) if token_ids is not None else [0] * count
        events = self.advance(now_s)
        account.held.extend((token, now_s) for token in ids)
        return _merge(events, self._release_due(request_id, account, now_s))

    def advance(self, now_s: float) -> DepositEvents:
        """Release every token due by now_s; report deposits found empty at a
        release time before now_s."""
        self._set_time(now_s)
        releases: list[Release] = []
        violations: list[Violation] = []
        for request_id, account in self._accounts.items():
            events = self._release_due(request_id, account, now_s)
            releases.extend(events.releases)
            violations.extend(events.violations)
        return DepositEvents(tuple(releases), tuple(violations))

    def finish(self, request_id: str, now_s: float) -> DepositEvents:
        """The request finished: release what is due, then the rest at once;
        the deposit is closed."""
        events = self.advance(now_s)
        account = self._accounts.pop(request_id)
        burst = tuple(Release(request_id, token, g, now_s, True) for token, g in account.held)
        return DepositEvents(events.releases + burst, events.violations)

    def balance(self, request_id: str) -> int:
        """Tokens request_id holds in its deposit."""
        return len(self._account(request_id).held)

    def balances(self) -> dict[str, int]:
        """Tokens held per open request."""
        return {request_id: len(a.held) for request_id, a in self._accounts.items()}

    def balance_array(self, request_ids: Iterable[str]) -> npt.NDArray[np.int64]:
        """Balances in the order of request_ids (0 for a request with no open
        deposit), for the solver."""
        accounts = self._accounts
        return np.array(
            [len(accounts[r].held) if r in accounts else 0 for r in request_ids],
            dtype=np.int64,
        )

    def next_release_s(self, request_id: str) -> float:
        """When request_id's next token is due (already past if it missed)."""
        return self._account(request_id).next_release_s

    def violations(self, request_id: str) -> int:
        """Violations the user of request_id has seen so far."""
        return self._account(request_id).violations

    def released(self, request_id: str) -> int:
        return self._account(request_id).released

    def request_ids(self) -> tuple[str, ...]:
        return tuple(self._accounts)

    def to_dict(self) -> dict[str, Any]:
        return {
            "now_s": self.now_s,
            "requests": [
                {
                    "id": request_id,
                    "slo_tbt_s": a.slo_tbt_s,
                    "anchor_s": a.anchor_s,
                    "on_time": a.on_time,
                    "held": [[token, g] for token, g in a.held],
                    "released": a.released,
                    "violations": a.violations,
                    "missed": a.missed,
                }
                for request_id, a in sorted(self._accounts.items())
            ],
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TokenDeposit:
        accounts = {
            str(r["id"]): _Account(
                slo_tbt_s=float(r["slo_tbt_s"]),
                anchor_s=float(r["anchor_s"]),
                on_time=int(r["on_time"]),
                held=deque((int(token), float(g)) for token, g in r["held"]),
                released=int(r["released"]),
                violations=int(r["violations"]),
                missed=bool(r["missed"]),
            )
            for r in data["requests"]
        }
        return cls(now_s=float(data["now_s"]), _accounts=accounts)

    def _account(self, request_id: str) -> _Account:
        try:
            return self._accounts[request_id]
        except KeyError:
            raise KeyError(f"no open deposit for request {request_id!r}") from None

    def _set_time(self, now_s: float) -> None:
        if now_s < self.now_s:
            raise ValueError(f"time went backwards: {now_s} < {self.now_s}")
        self.now_s = now_s

    @staticmethod
    def _release_due(request_id: str, account: _Account, now_s: float) -> DepositEvents:
        releases: list[Release] = []
        violations: list[Violation] = []
        while True:
            due = account.next_release_s
            if not account.held:
                if due < now_s and not account.missed:
                    account.missed = True
                    account.violations += 1
                    violations.append(Violation(request_id, due))
                break
            token, generated = account.held[0]
            at = max(due, generated)
            if at > now_s:
                break
            account.held.popleft()
            if at > due:
                account.anchor_s = at
                account.on_time = 0
            else:
                account.on_time += 1
            account.released += 1
            account.missed = False
            releases.append(Release(request_id, token, generated, at))
        return DepositEvents(tuple(releases), tuple(violations))


def _merge(first: DepositEvents, second: DepositEvents) -> DepositEvents:
    return DepositEvents(first.releases + second.releases, first.violations + second.violations)
