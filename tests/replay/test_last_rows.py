import numpy as np
import pytest

from planner.replay.last_rows import LastRows


def test_the_same_rows_take_the_same_read_only_array() -> None:
    last = LastRows()
    first = last.array([4, 2, 7])
    assert first.tolist() == [4, 2, 7]
    assert first.dtype == np.int64
    assert last.array([4, 2, 7]) is first
    with pytest.raises(ValueError, match="read-only"):
        first[0] = 1


def test_other_rows_take_a_new_array() -> None:
    last = LastRows()
    first = last.array([4, 2])
    other = last.array([4, 3])
    assert other is not first
    assert other.tolist() == [4, 3]
    assert first.tolist() == [4, 2]
    assert last.array([]).tolist() == []


def test_rows_of_an_array_give_its_list() -> None:
    last = LastRows()
    array = last.array([9, 1])
    assert last.rows(array) == [9, 1]
    assert last.rows(np.array([3, 5], dtype=np.int64)) == [3, 5]
    assert last.rows(np.array([9, 1], dtype=np.int64)) == [9, 1]
