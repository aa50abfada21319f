"""Named registries: each kind of policy (scheduling, KV residency, cluster,
serverless) and the solver backends are looked up by name in one of these,
and everything that lists them (``--policy`` choices, ``planner profiles
policies``, GetPlannerInfo, docs/policies.md) reads the registry.

An entry is registered either as the object itself (``register``) or by
module path and attribute (``register_lazy``): the module is imported the
first time the entry is looked up, so listing names imports nothing.

This module imports nothing of the planner, so any layer may use it.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Generic, TypeVar, cast

T = TypeVar("T")


class UnknownNameError(KeyError, ValueError):
    """A name no registry entry has; the message lists the known ones."""

    def __init__(self, kind: str, name: str, known: tuple[str, ...]) -> None:
        self.kind = kind
        self.name = name
        self.known = known
        self.message = f"unknown {kind} {name!r} (known: {', '.join(known) or 'none'})"
        super().__init__(self.message)

    def __str__(self) -> str:
        return self.message


@dataclass(frozen=True, slots=True)
class RegistryEntry:
    """What the listings show of one entry: its name, a one-line summary,
    where it is defined (module:attribute) and the RPC that plans it in
    production ("Service.Method"; "" when only the replay has it)."""

    name: str
    summary: str
    source: str
    served_by: str = ""


class Registry(Mapping[str, T], Generic[T]):
    """Name -> T, in registration order. ``registry[name]`` raises
    UnknownNameError (a KeyError and a ValueError) for an unknown name."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._loaded: dict[str, T] = {}
        self._loaders: dict[str, Callable[[], T]] = {}
        self._entries: dict[str, RegistryEntry] = {}

    def register(self, name: str, entry: T, *, summary: str = "", served_by: str = "") -> T:
        """Registers `entry` under `name`; returns it."""
        self._add(RegistryEntry(name, summary, _source_of(entry), served_by))
        self._loaded[name] = entry
        return entry

    def register_lazy(
        self, name: str, module: str, attribute: str, *, summary: str = "", served_by: str = ""
    ) -> None:
        """Registers `module`'s `attribute` (dotted: ``Class.factory``)
        under `name`, imported on first lookup."""

        def load() -> T:
            found: object = importlib.import_module(module)
            for part in attribute.split("."):
                found = getattr(found, part)
            return cast(T, found)

        self._add(RegistryEntry(name, summary, f"{module}:{attribute}", served_by))
        self._loaders[name] = load

    def _add(self, entry: RegistryEntry) -> None:
        name = entry.name
        if not name or name != name.strip() or any(c.isspace() or c == "/" for c in name):
            raise ValueError(f"{self.kind} name {name!r}: no spaces or '/' allowed")
        if name in self._entries:
            raise ValueError(f"{self.kind} {name!r} is already registered")
        self._entries[name] = entry

    def __getitem__(self, name: str) -> T:
        if name in self._loaded:
            return self._loaded[name]
        loader = self._loaders.get(name)
        if loader is None:
            raise UnknownNameError(self.kind, name, self.names())
        entry = loader()
        self._loaded[name] = entry
        return entry

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def names(self) -> tuple[str, ...]:
        return tuple(self._entries)

    def entries(self) -> tuple[RegistryEntry, ...]:
        """Every entry's name, summary and source, without importing any."""
        return tuple(self._entries.values())

    def check(self, name: str) -> str:
        """`name` if registered, else UnknownNameError (imports nothing)."""
        if name not in self._entries:
            raise UnknownNameError(self.kind, name, self.names())
        return name


def registry_of(
    kind: str,
    key: Callable[[T], str],
    entries: Iterable[T],
    *,
    summaries: Mapping[str, str] | None = None,
    served_by: Mapping[str, str] | None = None,
) -> Registry[T]:
    """A registry of `entries`, each under the name `key` gives it;
    summaries: name -> one line; served_by: name -> the RPC that plans it
    in production."""
    registry: Registry[T] = Registry(kind)
    lines = summaries or {}
    rpcs = served_by or {}
    for entry in entries:
        name = key(entry)
        registry.register(name, entry, summary=lines.get(name, ""), served_by=rpcs.get(name, ""))
    unknown = sorted((set(lines) | set(rpcs)) - set(registry))
    if unknown:
        raise UnknownNameError(kind, unknown[0], registry.names())
    return registry


def _source_of(entry: object) -> str:
    module = getattr(entry, "__module__", None)
    qualname = getattr(entry, "__qualname__", None)
    if isinstance(module, str) and isinstance(qualname, str):
        return f"{module}:{qualname}"
    return f"{type(entry).__module__}:{type(entry).__qualname__}"
