"""When a share of a slice ends (planner.policies.serverless.sharing):
hand-checked cases of each action and the boundaries of the comparison."""

from __future__ import annotations

import math

import pytest

from planner.policies.serverless import GIVE_UP, MOVE, QUEUE_BACK, Sharer, end_share


def sharer(model: str, **changes: float) -> Sharer:
    values: dict[str, float] = {
        "in_flight": 1,
        "steps_left": 100,
        "shared_step_s": 0.08,
        "alone_step_s": 0.02,
        "top_up_s": 0.02,
        "move_s": 0.1,
        "slack_s": 0.0,
    }
    values.update(changes)
    return Sharer(
        model,
        int(values["in_flight"]),
        int(values["steps_left"]),
        values["shared_step_s"],
        values["alone_step_s"],
        values["top_up_s"],
        values["move_s"],
        values["slack_s"],
    )


def test_a_resident_with_nothing_in_flight_gives_up_its_part() -> None:
    busy, idle = sharer("a"), sharer("b", in_flight=0, steps_left=0)
    for order in ((busy, idle), (idle, busy)):
        end = end_share(order, free_slice=False)
        assert end is not None and end.model == "b" and end.action == GIVE_UP
        assert end.wait_bound_s == 0.0
    # Nobody busy, or nobody to give the HBM to: the share stays.
    assert end_share([idle, sharer("c", in_flight=0, steps_left=0)], free_slice=True) is None
    assert end_share([busy], free_slice=True) is None
    assert end_share([], free_slice=True) is None
    # Of several idle ones, the latest to join leaves first.
    end = end_share([busy, idle, sharer("c", in_flight=0)], free_slice=False)
    assert end is not None and end.model == "c"


def test_two_busy_residents_one_moves_to_a_free_slice() -> None:
    a = sharer("a", steps_left=100)
    b = sharer("b", steps_left=50)
    end = end_share([a, b], free_slice=True)
    # Sharing: 100 x 0.08 + 50 x 0.08 = 12 s of turns. b leaving: a tops up
    # (0.02) and runs alone, 0.02 + 100 x 0.02 = 2.02 s, b elsewhere in
    # parallel 0.1 + 50 x 0.02 = 1.1 s: 2.02 s. a leaving: b 0.02 + 1.0 =
    # 1.02 s, a 0.1 + 2.0 = 2.1 s: 2.1 s. b moves.
    assert end is not None and end.action == MOVE and end.model == "b"
    assert end.continue_s == pytest.approx(12.0)
    assert end.after_s == pytest.approx(2.02)
    assert end.wait_bound_s == 0.0


def test_queueing_back_needs_the_wait_within_the_slack() -> None:
    a = sharer("a", steps_left=100, slack_s=1.0)
    b = sharer("b", steps_left=50, slack_s=2.11)
    # No free slice: b would wait for a's 2.02 s plus its 0.1 s switch,
    # 2.12 s > its 2.11 s of slack; a would wait 1.02 + 0.1 > 1.0: no end.
    assert end_share([a, b], free_slice=False) is None
    b = sharer("b", steps_left=50, slack_s=2.12)
    end = end_share([a, b], free_slice=False)
    assert end is not None and end.action == QUEUE_BACK and end.model == "b"
    # a alone 2.02 s, then b 0.1 + 50 x 0.02 = 1.1 s after it.
    assert end.after_s == pytest.approx(3.12)
    assert end.wait_bound_s == pytest.approx(2.02)


def test_a_share_that_streams_little_goes_on_unless_a_slice_is_free() -> None:
    # Steps as fast shared as alone: 150 x 0.02 = 3.0 s of turns against
    # 2.02 + 1.1 = 3.12 s one after the other: queueing never pays.
    cheap = {"shared_step_s": 0.02, "slack_s": math.inf}
    a, b = sharer("a", **cheap), sharer("b", steps_left=50, **cheap)
    assert end_share([a, b], free_slice=False) is None
    # A free slice runs them in parallel: 2.02 s against 3.0 s, past the margin.
    end = end_share([a, b], free_slice=True)
    assert end is not None and end.action == MOVE


def test_the_margin_bounds_ending_a_share() -> None:
    # Moving b: 2.02 s against 12 s sharing; a margin of 0.83 needs it below
    # 2.04 s (ends it), one of 0.84 below 1.92 s (keeps it).
    a, b = sharer("a"), sharer("b", steps_left=50)
    assert end_share([a, b], free_slice=True, margin=0.83) is not None
    assert end_share([a, b], free_slice=True, margin=0.84) is None
    with pytest.raises(ValueError, match="margin"):
        end_share([a, b], free_slice=True, margin=1.0)


def test_three_residents_two_staying_still_share() -> None:
    # With three busy residents the two staying keep their shared steps:
    # c leaving: rest 100 x 0.08 + 100 x 0.08 = 16 s against 24 s sharing;
    # c elsewhere 0.1 + 100 x 0.02: after 16 s < 0.9 x 24.
    end = end_share([sharer("a"), sharer("b"), sharer("c")], free_slice=True)
    assert end is not None and end.model == "c" and end.after_s == pytest.approx(16.0)


def test_bad_sharers_are_refused() -> None:
    with pytest.raises(ValueError, match="shared_step_s"):
        end_share([sharer("a", shared_step_s=-1.0), sharer("b")], free_slice=True)
    with pytest.raises(ValueError, match="in_flight"):
        end_share([sharer("a", in_flight=-1), sharer("b")], free_slice=True)
