"""A sweep file (`planner sweep SWEEP.yaml`) and its grid of replay
configurations.

    trace: fixtures/traces/default.jsonl   # the fixed values ...
    topology: rotation
    slo_ttft: 2.0
    out: sweep.parquet
    grid:                                  # ... and every combination of these
      policy: [fcfs, lvf]
      rate_scale: [0.5, 1.0]
      alpha: [1.0, 3.0]

Keys are the run's axes (trace, topology, profile, policy, rate_scale) and
every knob (planner.commands.knobs); a key is fixed or a grid list, not both.
Without a policy every default policy of the topology runs. Paths are read
from the current folder, as on the command line.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from planner.commands.config_file import (
    ConfigError,
    ConfigOrigins,
    Entry,
    check_value,
    mapping_entries,
    plain_entries,
    read_mapping,
)
from planner.commands.knobs import knob_table
from planner.commands.replay import DEFAULT_POLICIES, MAX_RATE_SCALE
from planner.replay.policy_registries import ROTATION, TOPOLOGY_POLICIES
from planner.replay.setup import DEFAULT_PROFILE

# The axes of a run besides the knobs, and their flags on `planner replay`.
AXES: dict[str, str] = {
    "trace": "TRACE",
    "topology": "--topology",
    "profile": "--profile",
    "policy": "--policy",
    "rate_scale": "--rate-scale",
}
GRID = "grid"
OUT = "out"


@dataclass(frozen=True)
class Configuration:
    """One replay of the grid: one trace, topology, profile, policy and rate
    scale, and the knobs the sweep names (the others keep their defaults)."""

    index: int
    trace: str
    topology: str
    profile: str
    policy: str
    rate_scale: float
    knobs: tuple[tuple[str, Any], ...]

    def columns(self) -> dict[str, Any]:
        """What identifies the configuration in the output table."""
        return {
            "config_id": self.config_id,
            "trace": self.trace,
            "topology": self.topology,
            "profile": self.profile,
            "policy": self.policy,
            "rate_scale": self.rate_scale,
            **dict(self.knobs),
        }

    @property
    def config_id(self) -> str:
        """A digest of the configuration: the key a resumed sweep skips by."""
        named = {
            "trace": self.trace,
            "topology": self.topology,
            "profile": self.profile,
            "policy": self.policy,
            "rate_scale": self.rate_scale,
            **dict(self.knobs),
        }
        text = json.dumps(named, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def argv(self, trace_path: str | None = None) -> list[str]:
        """`planner replay` arguments for this configuration."""
        argv = [
            "replay",
            trace_path or self.trace,
            "--quiet",
            "--topology",
            self.topology,
            "--profile",
            self.profile,
            "--policy",
            self.policy,
            "--rate-scale",
            repr(self.rate_scale),
        ]
        table = knob_table()
        for name, value in self.knobs:
            if value is not None:
                argv += [table[name].flag, repr(value) if isinstance(value, float) else str(value)]
        return argv


@dataclass(frozen=True)
class SweepSpec:
    configurations: tuple[Configuration, ...]
    out: str | None
    # Where each key was written, to name it when a run refuses a value.
    origins: ConfigOrigins
    source: str


def read_spec(path: str | os.PathLike[str]) -> SweepSpec:
    """The sweep file at path. Raises ConfigError naming file, line, key."""
    return spec_of(read_mapping(path), os.fspath(path))


def spec_from_mapping(data: Mapping[str, Any], name: str = "sweep") -> SweepSpec:
    """A sweep given as a Python mapping (the same keys as the file)."""
    return spec_of(plain_entries(name, data), name)


def spec_of(entries: dict[str, Entry], source: str) -> SweepSpec:
    fixed: dict[str, Any] = {}
    lists: dict[str, list[Any]] = {}
    where: dict[str, Entry] = {}
    out: str | None = None
    grid_entries: dict[str, Entry] = {}
    for key, entry in entries.items():
        if key == GRID:
            grid_entries = _grid_entries(entry)
        elif key == OUT:
            out = check_value(entry, str, optional=True)
        else:
            fixed[key] = _value(entry)
            where[key] = entry
    for key, entry in grid_entries.items():
        if key in fixed:
            raise entry.error(f"is also fixed at {where[key].where}: give it once")
        lists[key] = _grid_values(entry)
        where[key] = entry
    configurations = _expand(fixed, lists, where, source)
    flags = {**AXES, **{name: k.flag for name, k in knob_table().items()}}
    origins = ConfigOrigins({key: (entry, flags[key]) for key, entry in where.items()})
    return SweepSpec(tuple(configurations), out, origins, source)


def _grid_entries(entry: Entry) -> dict[str, Entry]:
    name = entry.where.rsplit(":", 1)[0]
    if entry.node is not None:
        if not isinstance(entry.node, yaml.MappingNode):
            raise entry.error("must be a mapping of key: [values]")
        return mapping_entries(name, entry.node)
    if not isinstance(entry.value, Mapping):
        raise entry.error("must be a mapping of key: [values]")
    return plain_entries(f"{entry.where}.{GRID}", entry.value)


def _grid_values(entry: Entry) -> list[Any]:
    if not isinstance(entry.value, list) or not entry.value:
        raise entry.error("a grid key takes a non-empty list of values")
    nodes = entry.node.value if isinstance(entry.node, yaml.SequenceNode) else None
    values: list[Any] = []
    for i, item in enumerate(entry.value):
        at = entry.where
        if nodes is not None:
            at = f"{entry.where.rsplit(':', 1)[0]}:{nodes[i].start_mark.line + 1}"
        value = _value(Entry(entry.key, item, at))
        if value in values:
            raise ConfigError(at, entry.key, f"lists {item!r} twice")
        values.append(value)
    return values


def _value(entry: Entry) -> Any:
    """One value of a key, checked against its type (and choices)."""
    key = entry.key
    if key in AXES:
        if key == "rate_scale":
            scale = check_value(entry, float, optional=False)
            if not (math.isfinite(scale) and 0 < scale <= MAX_RATE_SCALE):
                raise entry.error(f"must be a number > 0 and <= {MAX_RATE_SCALE:g}, got {scale}")
            return scale
        text = check_value(entry, str, optional=False)
        if key == "topology" and text not in TOPOLOGY_POLICIES:
            raise entry.error(f"{text!r} is not one of {', '.join(TOPOLOGY_POLICIES)}")
        if key == "trace" and not Path(text).is_file():
            raise entry.error(f"no such file: {text}")
        return text
    table = knob_table()
    knob = table.get(key)
    if knob is None:
        known = sorted([*AXES, *table, GRID, OUT])
        raise entry.error(f"unknown key (known: {', '.join(known)})")
    value = check_value(entry, knob.value_type, knob.optional)
    if knob.choices is not None and value is not None and value not in knob.choices:
        raise entry.error(f"{value!r} is not one of {', '.join(knob.choices)}")
    if isinstance(value, float) and math.isnan(value):
        raise entry.error("must be a number, got nan")
    return value


def _expand(
    fixed: dict[str, Any], lists: dict[str, list[Any]], where: dict[str, Entry], source: str
) -> list[Configuration]:
    if "trace" not in fixed and "trace" not in lists:
        raise ConfigError(source, "trace", "missing: name the trace (or a grid of traces)")
    order = list(knob_table())
    configurations: list[Configuration] = []
    keys = list(lists)
    for combination in itertools.product(*(lists[k] for k in keys)):
        values = {**fixed, **dict(zip(keys, combination, strict=True))}
        topology = values.get("topology", ROTATION)
        policies = [values["policy"]] if "policy" in values else list(DEFAULT_POLICIES[topology])
        for policy in policies:
            if policy not in TOPOLOGY_POLICIES[topology]:
                entry = where["policy"]
                known = ", ".join(TOPOLOGY_POLICIES[topology])
                raise ConfigError(
                    entry.where,
                    "policy",
                    f"unknown policy {policy!r} for topology {topology} (choose from {known})",
                )
            knobs = tuple((name, values[name]) for name in order if name in values)
            configurations.append(
                Configuration(
                    index=len(configurations),
                    trace=values["trace"],
                    topology=topology,
                    profile=values.get("profile", DEFAULT_PROFILE),
                    policy=policy,
                    rate_scale=float(values.get("rate_scale", 1.0)),
                    knobs=knobs,
                )
            )
    return configurations
