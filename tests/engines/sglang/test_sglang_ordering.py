"""The pure reorderings: exact small cases and permutation properties."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from planner.adapters.sglang.ordering import planned_retractions, retraction_order, waiting_order


def test_retraction_order_puts_first_victim_at_the_end() -> None:
    rids = ["a", "b", "c", "d"]
    assert retraction_order([0, 1, 2, 3], rids, ["b", "d"]) == [0, 2, 3, 1]


def test_retraction_order_ignores_unknown_victims() -> None:
    assert retraction_order([2, 0, 1], ["a", "b", "c"], ["zz"]) == [2, 0, 1]


def test_waiting_order_puts_prioritized_first_in_planner_order() -> None:
    assert waiting_order(["a", "b", "c", "d"], ["d", "b"]) == [3, 1, 0, 2]


def test_planned_retractions_keep_one_request() -> None:
    assert planned_retractions(["a", "b"], ["b", "a"]) == [1]
    assert planned_retractions(["a", "b", "c"], ["c", "c", "x"]) == [2]


ids = st.lists(st.sampled_from("abcdefgh"), unique=True, max_size=8)


@given(ids, ids, st.randoms(use_true_random=False))
def test_retraction_order_is_a_permutation_with_victims_popped_first(
    rids: list[str], victims: list[str], rng: object
) -> None:
    keep_order = list(range(len(rids)))
    rng.shuffle(keep_order)  # type: ignore[attr-defined]
    order = retraction_order(keep_order, rids, victims)
    assert sorted(order) == sorted(keep_order)
    present = [v for v in victims if v in rids]
    # SGLang pops from the end: the planner's victims come out in its order.
    popped = [rids[i] for i in reversed(order)][: len(present)]
    assert popped == present
    others = [i for i in keep_order if rids[i] not in victims]
    assert order[: len(others)] == others


@given(ids, ids)
def test_waiting_order_is_a_permutation(rids: list[str], prioritized: list[str]) -> None:
    order = waiting_order(rids, prioritized)
    assert sorted(order) == list(range(len(rids)))
    present = [p for p in prioritized if p in rids]
    assert [rids[i] for i in order[: len(present)]] == present


@given(ids, st.lists(st.sampled_from("abcdefgh"), max_size=10))
def test_planned_retractions_never_empty_the_batch(rids: list[str], victims: list[str]) -> None:
    chosen = planned_retractions(rids, victims)
    assert len(set(chosen)) == len(chosen)
    assert all(rids[i] in victims for i in chosen)
    assert len(chosen) <= max(len(rids) - 1, 0)
