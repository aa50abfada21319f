"""`--config FILE.yaml`: a command's options from a YAML mapping, each key
an option's name with underscores (``slo_ttft: 2`` is ``--slo-ttft 2``);
options given on the command line win over the file.

The file is read with PyYAML's safe loader, node by node, so that every
key keeps its line: an unknown key, a value of the wrong type and a value
the command refuses later are all named as ``FILE:LINE: key: problem``.
"""

from __future__ import annotations

import argparse
import math
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

# Options a configuration file does not set.
NOT_IN_FILE = frozenset({"help", "config", "version"})


class ConfigError(ValueError):
    """A bad configuration: str() is ``FILE:LINE: key: problem``."""

    def __init__(self, where: str, key: str | None, problem: str) -> None:
        self.where = where
        self.key = key
        self.problem = problem
        super().__init__(f"{where}: {key}: {problem}" if key else f"{where}: {problem}")


@dataclass(frozen=True)
class Entry:
    """One key of a mapping read from a file, with where it was written."""

    key: str
    value: Any
    where: str
    node: yaml.Node | None = None

    def error(self, problem: str) -> ConfigError:
        return ConfigError(self.where, self.key, problem)


def read_mapping(path: str | os.PathLike[str]) -> dict[str, Entry]:
    """The top-level mapping of a YAML file, each key with its line.
    Raises ConfigError for a missing file, bad YAML, a document that is
    not a mapping, or a key written twice."""
    name = os.fspath(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(name, None, f"cannot read: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise ConfigError(name, None, "not UTF-8 text") from None
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return {}
        return mapping_entries(name, node, loader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"{name}:{mark.line + 1}" if mark is not None else name
        raise ConfigError(where, None, f"invalid YAML: {exc.problem or exc}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(name, None, f"invalid YAML: {exc}") from None
    finally:
        loader.dispose()


def mapping_entries(
    name: str, node: yaml.Node, loader: yaml.SafeLoader | None = None
) -> dict[str, Entry]:
    """A YAML mapping node's keys with their values and lines."""
    if not isinstance(node, yaml.MappingNode):
        raise ConfigError(_at(name, node), None, "must be a mapping of key: value")
    constructor = loader or yaml.SafeLoader("")
    entries: dict[str, Entry] = {}
    for key_node, value_node in node.value:
        where = _at(name, key_node)
        key = constructor.construct_object(key_node, deep=True)
        if not isinstance(key, str):
            raise ConfigError(where, None, f"a key must be a name, got {key!r}")
        if key in entries:
            raise ConfigError(where, key, f"written twice (first at {entries[key].where})")
        value = constructor.construct_object(value_node, deep=True)
        entries[key] = Entry(key, value, where, value_node)
    return entries


def plain_entries(name: str, data: Mapping[str, Any]) -> dict[str, Entry]:
    """A mapping given in Python, as entries named `name`."""
    return {str(k): Entry(str(k), v, name) for k, v in data.items()}


def _at(name: str, node: yaml.Node) -> str:
    return f"{name}:{node.start_mark.line + 1}"


def check_value(entry: Entry, value_type: type[Any] | None, optional: bool) -> Any:
    """entry's value as value_type, strict about YAML's types: an integer
    where an integer is meant, a number (integer or float) where a float
    is, a string or a number where text is; null only when optional."""
    value = entry.value
    if value is None:
        if optional:
            return None
        raise entry.error("must have a value")
    if value_type is bool:
        if isinstance(value, bool):
            return value
        raise entry.error(f"must be true or false, got {value!r}")
    if isinstance(value, bool):
        raise entry.error(f"must be {_type_name(value_type)}, got {value!r}")
    if value_type is int:
        if isinstance(value, int):
            return value
    elif value_type is float:
        if isinstance(value, int | float):
            return float(value)
    elif value_type in (None, str, Path):
        if isinstance(value, str | int | float):
            text = str(value)
            return Path(text) if value_type is Path else text
    elif value_type is not None:
        raise entry.error(f"cannot be set in a file (of type {value_type.__name__})")
    raise entry.error(f"must be {_type_name(value_type)}, got {value!r}")


def _type_name(value_type: type[Any] | None) -> str:
    return {int: "an integer", float: "a number", bool: "true or false"}.get(
        value_type,  # type: ignore[arg-type]
        "text",
    )


def option_actions(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    """The options a file may set: dest -> action."""
    return {
        a.dest: a
        for a in parser._actions  # argparse keeps no public list
        if a.option_strings and a.dest not in NOT_IN_FILE and a.dest != argparse.SUPPRESS
    }


def option_value(entry: Entry, action: argparse.Action) -> Any:
    """entry's value for action: its type, its choices, a list for an
    option that repeats."""
    if action.nargs == 0:
        return check_value(entry, bool, optional=False)
    repeats = isinstance(action, argparse._AppendAction)
    value_type = action.type if isinstance(action.type, type) else None
    if repeats:
        items = entry.value if isinstance(entry.value, list) else [entry.value]
        values = [check_value(Entry(entry.key, v, entry.where), value_type, False) for v in items]
        if not values:
            raise entry.error("must list at least one value")
    else:
        values = [check_value(entry, value_type, optional=action.default is None)]
    for v in values:
        if action.choices is not None and v is not None and v not in action.choices:
            choices = ", ".join(map(str, action.choices))
            raise entry.error(f"{v!r} is not one of {choices}")
        if isinstance(v, float) and math.isnan(v):
            raise entry.error("must be a number, got nan")
    return values if repeats else values[0]


@dataclass(frozen=True)
class ConfigOrigins:
    """Which options a configuration file set, for naming it in errors."""

    entries: Mapping[str, tuple[Entry, str]]  # dest -> (entry, flag)

    def locate(self, message: str) -> str:
        """message prefixed with FILE:LINE: key: where it names an option
        that came from the file."""
        for entry, flag in self.entries.values():
            if re.search(re.escape(flag) + r"(?![\w-])", message):
                return f"{entry.where}: {entry.key}: {message}"
        return message


NO_ORIGINS = ConfigOrigins({})


def origins_of(args: argparse.Namespace) -> ConfigOrigins:
    found = getattr(args, "config_origins", None)
    return found if isinstance(found, ConfigOrigins) else NO_ORIGINS


def add_config_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--config",
        metavar="FILE.yaml",
        help="read options from this YAML mapping, each key an option's name with "
        "underscores (slo_ttft: 2 is --slo-ttft 2); the command line wins over the file",
    )
    parser.set_defaults(config_parser=parser)


def parse_with_config(
    parser: argparse.ArgumentParser, argv: Sequence[str] | None
) -> argparse.Namespace:
    """parser.parse_args(argv), then, when the command was given --config,
    again with the file's values as defaults (so the command line wins).
    A bad file exits 2 naming its file, line and key, as argparse does."""
    args = parser.parse_args(argv)
    path = getattr(args, "config", None)
    command: argparse.ArgumentParser | None = getattr(args, "config_parser", None)
    if path is None or command is None:
        return args
    try:
        values, origins = _file_values(command, path)
    except ConfigError as exc:
        command.error(f"--config {exc}")
    repeated = {d for d, a in option_actions(command).items() if isinstance(a, _Append)}
    command.set_defaults(**{d: v for d, v in values.items() if d not in repeated})
    again = parser.parse_args(argv)
    for dest in repeated & set(values):
        if getattr(args, dest) is None:
            setattr(again, dest, values[dest])
    # Only the options the command line left to the file are the file's.
    again.config_origins = ConfigOrigins(
        {d: o for d, o in origins.entries.items() if getattr(again, d) == values[d]}
    )
    return again


_Append = argparse._AppendAction


def _file_values(
    command: argparse.ArgumentParser, path: str
) -> tuple[dict[str, Any], ConfigOrigins]:
    actions = option_actions(command)
    values: dict[str, Any] = {}
    origins: dict[str, tuple[Entry, str]] = {}
    for key, entry in read_mapping(path).items():
        action = actions.get(key)
        if action is None:
            raise entry.error(f"unknown key (known: {', '.join(sorted(actions))})")
        values[key] = option_value(entry, action)
        origins[key] = (entry, action.option_strings[-1])
    return values, ConfigOrigins(origins)
