"""Proto3 JSON parse errors (google.protobuf.json_format) restated as
"<field path>: <reason>", the way every other bad-input message reads."""

from __future__ import annotations

import re

_FAILED_FIELD = re.compile(r"Failed to parse (\w+) field: ")
# json_format's own path where it gives one (with indices), e.g.
# ' at "PlanRotationRequest.snapshot.requests[0]"'.
_AT_PATH = re.compile(r' at "?[A-Z]\w*((?:\.[\w\[\]]+)*)"?(?=\.|$)')
_UNKNOWN_FIELD = re.compile(r'has no field named "([^"]*)"')
_NOT_A_LIST = re.compile(r"^repeated field (\w+) must be in \[\] which is (.*)$")


def describe_json_error(error: str) -> str:
    """e.g. 'Failed to parse snapshot field: Failed to parse now_s field:
    Couldn't parse float: soon at PlanRotationRequest.snapshot.now_s' ->
    "snapshot.now_s: Couldn't parse float: soon"."""
    rest = " ".join(error.split()).rstrip(".")
    chain: list[str] = []
    while match := _FAILED_FIELD.match(rest):
        chain.append(match.group(1))
        rest = rest[match.end() :]
    path = ".".join(chain)
    if at := _AT_PATH.search(rest):
        path = at.group(1).lstrip(".") or path
        rest = rest[: at.start()] + rest[at.end() :]
    if not_a_list := _NOT_A_LIST.match(rest):
        name, got = not_a_list.groups()
        if path.rsplit(".", 1)[-1] != name:
            path = f"{path}.{name}" if path else name
        rest = f"must be a JSON array, got {got}"
    elif unknown := _UNKNOWN_FIELD.search(rest):
        path = f"{path}.{unknown.group(1)}" if path else unknown.group(1)
    return f"{path}: {rest}" if path else rest
