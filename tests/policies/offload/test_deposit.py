"""Token-Deposit (DESIGN.md §3.2; OrbitFlow §3.2 "SLO-aware Token-Deposit")."""

from __future__ import annotations

import itertools
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planner.policies.offload import Release, TokenDeposit, Violation

SLO = 0.1


def opened(*ids: str, now_s: float = 0.0) -> TokenDeposit:
    deposit = TokenDeposit()
    for request_id in ids:
        deposit.open(request_id, now_s, SLO)
    return deposit


def times(releases: tuple[Release, ...]) -> list[float]:
    return [r.released_s for r in releases]


def test_fast_tokens_go_out_one_per_slo() -> None:
    # Opened at 0 (the previous visible token went out then); tokens made at
    # 0, 0.01, 0.02 wait and leave at 0.1, 0.2, 0.3.
    deposit = opened("a")
    events = [deposit.deposit("a", t, token_ids=[i]) for i, t in enumerate([0.0, 0.01, 0.02])]
    assert all(not e.releases for e in events)
    assert deposit.balance("a") == 3
    assert deposit.advance(0.0999).releases == ()
    first = deposit.advance(0.1).releases
    assert len(first) == 1
    assert (first[0].request_id, first[0].token_id, first[0].generated_s) == ("a", 0, 0.0)
    assert first[0].released_s == pytest.approx(0.1)
    assert not first[0].flushed
    rest = deposit.advance(0.35).releases
    assert times(rest) == pytest.approx([0.2, 0.3])
    assert [r.token_id for r in rest] == [1, 2]
    assert deposit.balance("a") == 0
    assert deposit.violations("a") == 0


def test_violation_is_visible_only_when_empty_at_a_release_time() -> None:
    deposit = opened("a")
    deposit.deposit("a", 0.05)
    assert deposit.advance(0.1).releases[0].released_s == pytest.approx(0.1)
    # The next release time is 0.2; a token made at 0.15 is on time.
    deposit.deposit("a", 0.15)
    events = deposit.advance(0.2)
    assert times(events.releases) == pytest.approx([0.2])
    assert events.violations == ()
    # Nothing by 0.3: at the release time the deposit is empty.
    assert deposit.advance(0.3).violations == ()  # exactly at the release time
    late = deposit.advance(0.31)
    assert [v.request_id for v in late.violations] == ["a"]
    assert late.violations[0].deadline_s == pytest.approx(0.3)
    assert deposit.violations("a") == 1
    # Still nothing by 0.45: the same late token, no second violation.
    assert deposit.advance(0.45).violations == ()
    # The late token goes out as soon as it is made; the clock restarts there.
    assert times(deposit.deposit("a", 0.5).releases) == [0.5]
    assert deposit.next_release_s("a") == pytest.approx(0.6)
    assert deposit.violations("a") == 1


def test_slow_steps_drain_the_deposit_before_a_violation_shows() -> None:
    # Three fast tokens build a balance; then tokens come every 0.15 s (slower
    # than the SLO) and the balance hides the violations for a while.
    deposit = opened("a")
    for t in (0.0, 0.01, 0.02):
        deposit.deposit("a", t)
    violations: list[Violation] = []
    for k in range(1, 8):
        events = deposit.deposit("a", 0.02 + 0.15 * k)
        violations.extend(events.violations)
    # Made at 0.17, 0.32, ..., 0.77, 0.92, 1.07; released at 0.1, 0.2, ..., 0.8
    # on time. The release time 0.9 finds the deposit empty: the token made at
    # 0.92 goes out late, then 1.02 finds it empty again (1.07 is late).
    assert [v.deadline_s for v in violations] == pytest.approx([0.9, 1.02])


def test_token_made_exactly_at_release_time_is_on_time() -> None:
    deposit = opened("a")
    events = deposit.deposit("a", 0.1)
    assert times(events.releases) == [0.1]
    assert events.violations == ()


def test_finish_flushes_the_rest_at_once() -> None:
    deposit = opened("a", "b")
    for t in (0.0, 0.01, 0.02, 0.03):
        deposit.deposit("a", t, token_ids=[int(t * 100)])
    events = deposit.finish("a", 0.15)
    assert times(events.releases) == pytest.approx([0.1, 0.15, 0.15, 0.15])
    assert [r.flushed for r in events.releases] == [False, True, True, True]
    assert [r.token_id for r in events.releases] == [0, 1, 2, 3]
    assert deposit.request_ids() == ("b",)
    with pytest.raises(KeyError):
        deposit.balance("a")


def test_balances_for_the_solver() -> None:
    deposit = opened("a", "b", "c")
    deposit.deposit("a", 0.0, count=3)
    deposit.deposit("b", 0.0)
    assert deposit.balances() == {"a": 3, "b": 1, "c": 0}
    assert deposit.balance_array(["c", "a", "zzz", "b"]).tolist() == [0, 3, 0, 1]
    deposit.advance(0.1)
    assert deposit.balances() == {"a": 2, "b": 0, "c": 0}


def test_each_request_keeps_its_own_clock_and_slo() -> None:
    deposit = TokenDeposit()
    deposit.open("a", 0.0, 0.1)
    deposit.open("b", 0.05, 0.2)
    deposit.deposit("a", 0.06, count=2)
    deposit.deposit("b", 0.06, count=2)
    events = deposit.advance(0.5)
    by_request = {
        r: [e.released_s for e in events.releases if e.request_id == r] for r in ("a", "b")
    }
    assert by_request["a"] == pytest.approx([0.1, 0.2])
    assert by_request["b"] == pytest.approx([0.25, 0.45])
    assert [v.request_id for v in events.violations] == ["a"]


def test_round_trip_through_json() -> None:
    deposit = opened("a", "b")
    deposit.deposit("a", 0.0, token_ids=[6, 7, 8, 9])
    deposit.advance(0.25)
    deposit.advance(0.35)  # "b" missed its 0.1 release: a violation
    copy = TokenDeposit.from_dict(json.loads(json.dumps(deposit.to_dict())))
    assert copy.to_dict() == deposit.to_dict()
    assert copy.balances() == {"a": 1, "b": 0}
    assert copy.violations("b") == 1
    assert copy.advance(0.5).releases == deposit.advance(0.5).releases


def test_time_must_not_go_backwards() -> None:
    deposit = opened("a", now_s=1.0)
    with pytest.raises(ValueError):
        deposit.deposit("a", 0.5)
    with pytest.raises(ValueError):
        deposit.open("a", 1.0, SLO)
    with pytest.raises(ValueError):
        deposit.open("b", 1.0, 0.0)


@settings(max_examples=100, deadline=None)
# Gaps on a microsecond grid: a gap a nanosecond past the SLO is a violation
# to the deposit but within the float tolerance this test compares with.
@given(st.lists(st.integers(0, 300_000).map(lambda us: us / 1e6), min_size=1, max_size=30))
def test_releases_are_fifo_and_never_closer_than_the_slo(gaps: list[float]) -> None:
    deposit = opened("a")
    now = 0.0
    releases: list[Release] = []
    violations = 0
    for gap in gaps:
        now += gap
        events = deposit.deposit("a", now)
        releases.extend(events.releases)
        violations += len(events.violations)
    # The request finishes when its last token is made.
    final = deposit.finish("a", now)
    violations += len(final.violations)
    every = releases + list(final.releases)
    assert len(every) == len(gaps)
    assert [r.generated_s for r in every] == sorted(r.generated_s for r in every)
    assert all(r.released_s >= r.generated_s for r in every)
    assert all(r.released_s == now for r in every if r.flushed)
    stamps = [0.0] + [r.released_s for r in every if not r.flushed]
    assert all(b - a >= SLO - 1e-9 for a, b in itertools.pairwise(stamps))
    # A violation is a gap longer than the SLO before a visible token.
    late = sum(b - a > SLO + 1e-9 for a, b in itertools.pairwise(stamps))
    assert violations == late
