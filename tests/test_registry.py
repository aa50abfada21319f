"""planner.registry: lookups by name, lazy entries, and the error that
names the unknown key and lists the known ones."""

from __future__ import annotations

import sys

import pytest

from planner.registry import Registry, UnknownNameError, registry_of


def test_entries_keep_registration_order_and_look_up_by_name() -> None:
    r: Registry[int] = Registry("number")
    r.register("one", 1, summary="the first")
    r.register("two", 2)
    assert r.names() == ("one", "two") and list(r) == ["one", "two"] and len(r) == 2
    assert r["two"] == 2 and "one" in r and "three" not in r
    assert r.entries()[0].summary == "the first"


def test_unknown_name_names_it_and_lists_the_known_ones() -> None:
    r = registry_of("colour", str.lower, ["Red", "Green"])
    with pytest.raises(UnknownNameError) as caught:
        r["blue"]
    assert str(caught.value) == "unknown colour 'blue' (known: red, green)"
    # Callers catching either kind of lookup error see it.
    assert isinstance(caught.value, KeyError) and isinstance(caught.value, ValueError)
    assert r.get("blue") is None
    with pytest.raises(UnknownNameError, match="known: red, green"):
        r.check("blue")


def test_duplicate_and_malformed_names_are_refused() -> None:
    r: Registry[int] = Registry("number")
    r.register("one", 1)
    with pytest.raises(ValueError, match="number 'one' is already registered"):
        r.register("one", 2)
    for bad in ("", " one", "a b", "kind/name"):
        with pytest.raises(ValueError, match="no spaces or '/'"):
            r.register(bad, 3)


def test_lazy_entry_imports_its_module_on_first_lookup_only() -> None:
    r: Registry[object] = Registry("thing")
    r.register_lazy("dumps", "json", "JSONEncoder.encode", summary="lazy")
    r.register_lazy("colorsys", "colorsys", "rgb_to_hsv")
    sys.modules.pop("colorsys", None)
    assert r.names() == ("dumps", "colorsys")
    assert r.entries()[1].source == "colorsys:rgb_to_hsv"
    assert "colorsys" not in sys.modules  # listing imports nothing
    rgb_to_hsv = r["colorsys"]
    assert "colorsys" in sys.modules
    assert rgb_to_hsv is sys.modules["colorsys"].rgb_to_hsv


def test_served_by_of_a_name_the_registry_lacks_is_refused() -> None:
    with pytest.raises(UnknownNameError, match="unknown colour 'blue'"):
        registry_of("colour", str.lower, ["Red"], served_by={"blue": "S.M"})
