"""How much of each model's weights a slice keeps in HBM
(``resident_split``): hand-checked splits, and as properties: the resident
bytes plus the KV kept never exceed the slice's HBM, no model exceeds its
cap, and the split is a water level (a model below its cap gets at least as
much as any other)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from planner.policies.serverless import resident_split
from planner.profiles import MODEL_PROFILES, ProfileError
from planner.profiles.c2c_cost import model_pass_cost
from planner.profiles.mig import find_mig_profile

GB = 10**9


def test_alone_on_a_slice_that_holds_it_keeps_every_weight() -> None:
    # 24 GB slice: 24 x 0.9 - 1.5 = 20.1 GB for weights and KV; 2 GB of KV.
    assert resident_split([16 * GB], 20.1 * GB, 2 * GB) == (16 * GB,)


def test_alone_on_a_slice_too_small_keeps_what_fits() -> None:
    # 12 GB slice: 9.3 GB, 2 GB of KV: 7.3 GB of the 16 stay, 8.7 stream.
    assert resident_split([16 * GB], 9.3 * GB, 2 * GB) == (7_300_000_000,)


def test_models_sharing_a_slice_get_an_equal_part() -> None:
    # Two 16 GB models, 4 GB of KV: (20.1 - 4) / 2 = 8.05 GB each.
    assert resident_split([16 * GB, 16 * GB], 20.1 * GB, 4 * GB) == (8_050_000_000,) * 2


def test_a_small_cap_leaves_the_rest_to_the_others() -> None:
    # A resident that may only shrink (it keeps 3 GB) and a newcomer: the
    # newcomer takes what the first leaves, up to its weights.
    assert resident_split([3 * GB, 16 * GB], 20.1 * GB, 4 * GB) == (3 * GB, 13_100_000_000)
    # Three models, 10 GB: 1 + 4.5 + 4.5.
    assert resident_split([1 * GB, 16 * GB, 16 * GB], 10 * GB, 0) == (
        1 * GB,
        4_500_000_000,
        4_500_000_000,
    )


def test_kv_over_the_hbm_leaves_nothing_resident() -> None:
    assert resident_split([16 * GB, 5 * GB], 9 * GB, 10 * GB) == (0, 0)
    assert resident_split([], 9 * GB, 1 * GB) == ()


def test_bad_input_is_refused() -> None:
    with pytest.raises(ValueError, match="caps"):
        resident_split([-1.0], 10.0, 0.0)
    with pytest.raises(ValueError, match="kv_bytes"):
        resident_split([1.0], 10.0, -1.0)


@given(
    caps=st.lists(st.integers(0, 40 * GB), max_size=6),
    free=st.integers(0, 90 * GB),
    kv=st.integers(0, 90 * GB),
)
def test_resident_weights_and_kv_fit_the_slice(caps: list[int], free: int, kv: int) -> None:
    split = resident_split(caps, free, kv)
    assert len(split) == len(caps)
    assert all(0 <= b <= c for b, c in zip(split, caps, strict=True))
    assert sum(split) <= max(0, free - kv)
    if kv <= free:
        assert sum(split) + kv <= free
    # A water level: nobody below its cap gets less than another (but for
    # the rounding of each part to whole bytes).
    for i, b in enumerate(split):
        if b < caps[i]:
            assert all(b >= other - len(caps) for other in split)
    # Nothing is left over that a model below its cap could take.
    if any(b < c for b, c in zip(split, caps, strict=True)):
        assert max(0, free - kv) - sum(split) <= len(caps)


def test_a_resident_fraction_reads_from_hbm_instead_of_c2c() -> None:
    llama = MODEL_PROFILES["llama-3-8b"]
    mig = find_mig_profile("gh200-3x24gb")
    args = {"rho": 0.0, "mig": mig, "c2c_gbps": 135.0, "kv_read_tokens": 1000.0}
    streamed = model_pass_cost(llama, 8, **args)  # type: ignore[arg-type]
    half = model_pass_cost(llama, 8, resident_fraction=0.5, **args)  # type: ignore[arg-type]
    resident = model_pass_cost(llama, 8, resident_fraction=1.0, **args)  # type: ignore[arg-type]
    weights = streamed.c2c_bytes  # rho 0: every weight once
    assert half.c2c_bytes == pytest.approx(weights / 2)
    assert half.hbm_bytes == pytest.approx(streamed.hbm_bytes + weights / 2)
    assert resident.c2c_bytes == 0.0 and resident.c2c_s == 0.0
    assert resident.hbm_bytes == pytest.approx(streamed.hbm_bytes + weights)
    # A decode step from HBM is several times faster than over the share.
    assert streamed.time_s > 4 * resident.time_s
    with pytest.raises(ProfileError, match="resident_fraction"):
        model_pass_cost(llama, 8, resident_fraction=1.5, **args)  # type: ignore[arg-type]
