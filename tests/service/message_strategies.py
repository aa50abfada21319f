"""Hypothesis strategies for any protobuf message, read from its descriptor:
arbitrary messages, one-field mutations of a valid message, and byte-level
mutations of a serialized one. Values favour the edges a validator has to
handle: NaN, ±inf, -0.0, integer extremes, unknown enum numbers, empty and
very long strings, few distinct ids (so duplicates), long repeated fields."""

from __future__ import annotations

import math
import sys
from collections.abc import Callable
from dataclasses import dataclass

from google.protobuf.descriptor import Descriptor, EnumDescriptor, FieldDescriptor
from google.protobuf.message import Message
from google.protobuf.message_factory import GetMessageClass
from hypothesis import strategies as st

F = FieldDescriptor
MAX_DEPTH = 3
# A long repeated field: one shallow value (its own submessages empty)
# repeated this many times, within LONG_FIELD_BYTES, so that a message's
# size (and the time a server takes over it) is bounded by these settings
# whatever the draw, far below the default 64 MiB message limit.
LONG_REPEATED = (2_000, 20_000)
LONG_FIELD_BYTES = 1 << 20

INT_RANGES: dict[int, tuple[int, int]] = {
    F.TYPE_INT32: (-(2**31), 2**31 - 1),
    F.TYPE_SINT32: (-(2**31), 2**31 - 1),
    F.TYPE_SFIXED32: (-(2**31), 2**31 - 1),
    F.TYPE_INT64: (-(2**63), 2**63 - 1),
    F.TYPE_SINT64: (-(2**63), 2**63 - 1),
    F.TYPE_SFIXED64: (-(2**63), 2**63 - 1),
    F.TYPE_UINT32: (0, 2**32 - 1),
    F.TYPE_FIXED32: (0, 2**32 - 1),
    F.TYPE_UINT64: (0, 2**64 - 1),
    F.TYPE_FIXED64: (0, 2**64 - 1),
}
EDGE_FLOATS = [
    *(math.nan, math.inf, -math.inf, -0.0, 0.0),
    *(sys.float_info.max, 1e300, -1e308, 5e-324, 1e-300, 1.7e12),
]
STRINGS = st.one_of(
    st.sampled_from(["", "a", "b", "x" * 300, "\u00e9\u00e9", " ", "a\x00b"]),
    st.text(max_size=12),
)


def _ints(lo: int, hi: int) -> st.SearchStrategy[int]:
    edges = [v for v in (lo, hi, -1, 0, 1, 2, 10**9, 2**31, 2**53 + 1) if lo <= v <= hi]
    return st.one_of(
        st.sampled_from(edges),
        st.integers(-1_000, 1_000_000).filter(lambda v: lo <= v <= hi),
        st.integers(lo, hi),
    )


def _floats(width: int) -> st.SearchStrategy[float]:
    edges = EDGE_FLOATS if width == 64 else [math.nan, math.inf, -math.inf, -0.0, 0.0, 3e38]
    return st.one_of(
        st.sampled_from(edges),
        st.floats(-10.0, 1e6, width=width),
        st.floats(width=width, allow_nan=True, allow_infinity=True),
    )


def _enums(enum: EnumDescriptor) -> st.SearchStrategy[int]:
    known = [v.number for v in enum.values]
    return st.one_of(st.sampled_from(known), st.integers(-(2**31), 2**31 - 1))


def message_class(descriptor: Descriptor) -> type[Message]:
    return GetMessageClass(descriptor)


def scalar_values(field: FieldDescriptor) -> st.SearchStrategy[object]:
    """Values of one element of a non-message field."""
    t = field.type
    if t in INT_RANGES:
        return _ints(*INT_RANGES[t])
    if t == F.TYPE_DOUBLE:
        return _floats(64)
    if t == F.TYPE_FLOAT:
        return _floats(32)
    if t == F.TYPE_BOOL:
        return st.booleans()
    if t == F.TYPE_STRING:
        return STRINGS
    if t == F.TYPE_BYTES:
        return st.binary(max_size=64)
    if t == F.TYPE_ENUM:
        return _enums(field.enum_type)
    raise TypeError(f"no strategy for field type {t} ({field.full_name})")


def _is_map(field: FieldDescriptor) -> bool:
    return (
        field.type == F.TYPE_MESSAGE
        and field.message_type.GetOptions().map_entry
        and _is_repeated(field)
    )


def _is_repeated(field: FieldDescriptor) -> bool:
    return bool(field.is_repeated)


def element_values(field: FieldDescriptor, depth: int) -> st.SearchStrategy[object]:
    if field.type == F.TYPE_MESSAGE:
        return messages(field.message_type, depth + 1)
    return scalar_values(field)


def field_values(field: FieldDescriptor, depth: int) -> st.SearchStrategy[object]:
    """What a whole field may hold: a value, a list, or a dict for maps."""
    if _is_map(field):
        entry = field.message_type
        key, value = entry.fields_by_name["key"], entry.fields_by_name["value"]
        return st.dictionaries(scalar_values(key), element_values(value, depth), max_size=4)
    element = element_values(field, depth)
    if not _is_repeated(field):
        return element
    short = st.lists(element, max_size=5)
    if depth > 0:
        return short
    # A long field at the top level.
    shallow = element_values(field, MAX_DEPTH - 1)
    long_ = st.tuples(shallow, st.integers(*LONG_REPEATED)).map(
        lambda p: [p[0]] * min(p[1], LONG_FIELD_BYTES // _encoded_size(p[0]))
    )
    return st.one_of(short, short, short, long_)


def _encoded_size(value: object) -> int:
    """An upper bound of the bytes one element of a repeated field takes."""
    if isinstance(value, Message):
        return value.ByteSize() + 8
    if isinstance(value, str):
        return len(value.encode("utf-8")) + 8
    if isinstance(value, bytes):
        return len(value) + 8
    return 16


def assign(message: Message, field: FieldDescriptor, value: object) -> None:
    """Set field of message to value (a list for repeated fields, a dict for maps)."""
    name = field.name
    if _is_map(field):
        target = getattr(message, name)
        target.clear()
        assert isinstance(value, dict)
        for k, v in value.items():
            if isinstance(v, Message):
                target[k].CopyFrom(v)
            else:
                target[k] = v
    elif _is_repeated(field):
        message.ClearField(name)
        assert isinstance(value, list)
        getattr(message, name).extend(value)
    elif field.type == F.TYPE_MESSAGE:
        assert isinstance(value, Message)
        getattr(message, name).CopyFrom(value)
    else:
        setattr(message, name, value)


def messages(descriptor: Descriptor, depth: int = 0) -> st.SearchStrategy[Message]:
    """Arbitrary messages of descriptor's type; each field present or not."""
    cls = message_class(descriptor)
    if depth > MAX_DEPTH:
        return st.builds(cls)
    fields = {f.name: st.none() | field_values(f, depth) for f in descriptor.fields}

    def build(values: dict[str, object]) -> Message:
        message = cls()
        for name, value in values.items():
            if value is not None:
                assign(message, descriptor.fields_by_name[name], value)
        return message

    return st.fixed_dictionaries(fields).map(build)


@dataclass(frozen=True)
class Slot:
    """One field of one (sub)message of a valid request, by path."""

    path: str
    owner: Callable[[Message], Message]
    field: FieldDescriptor


def slots(message: Message) -> list[Slot]:
    """Every field of message and of each submessage it holds (set or not)."""
    found: list[Slot] = []

    def walk(msg: Message, path: str, owner: Callable[[Message], Message]) -> None:
        for field in msg.DESCRIPTOR.fields:
            found.append(Slot(f"{path}{field.name}", owner, field))
            if field.type != F.TYPE_MESSAGE or _is_map(field):
                continue
            if _is_repeated(field):
                for i, item in enumerate(getattr(msg, field.name)):
                    walk(
                        item,
                        f"{path}{field.name}[{i}].",
                        _index(owner, field.name, i),
                    )
            elif msg.HasField(field.name):
                walk(getattr(msg, field.name), f"{path}{field.name}.", _attr(owner, field.name))

    walk(message, "", lambda m: m)
    return found


def _attr(owner: Callable[[Message], Message], name: str) -> Callable[[Message], Message]:
    return lambda m: getattr(owner(m), name)  # type: ignore[no-any-return]


def _index(owner: Callable[[Message], Message], name: str, i: int) -> Callable[[Message], Message]:
    return lambda m: getattr(owner(m), name)[i]  # type: ignore[no-any-return]


@st.composite
def mutations(draw: st.DrawFn, valid: Message, changes: int = 1) -> tuple[str, Message]:
    """valid with up to `changes` fields (anywhere in it) replaced, cleared,
    or an element of a repeated field duplicated; returns (what changed, the
    message)."""
    done: list[str] = []
    message = valid
    for _ in range(draw(st.integers(1, changes))):
        what, message = draw(_one_mutation(message))
        done.append(what)
    return "; ".join(done), message


@st.composite
def _one_mutation(draw: st.DrawFn, valid: Message) -> tuple[str, Message]:
    mutated = type(valid)()
    mutated.CopyFrom(valid)
    found = slots(valid)
    if not found:
        return "nothing to mutate", mutated
    slot = draw(st.sampled_from(found))
    owner = slot.owner(mutated)
    field = slot.field
    action = draw(st.sampled_from(["replace", "replace", "clear", "duplicate"]))
    if action == "clear":
        owner.ClearField(field.name)
    elif action == "duplicate" and _is_repeated(field) and not _is_map(field):
        items = getattr(owner, field.name)
        if len(items):
            items.append(items[draw(st.integers(0, len(items) - 1))])
    else:
        action = "replace"
        assign(owner, field, draw(field_values(field, 1)))
    return f"{action} {slot.path}", mutated


@st.composite
def byte_mutations(draw: st.DrawFn, valid: Message) -> bytes:
    """valid serialized, then truncated, bit-flipped, spliced or extended."""
    data = bytearray(valid.SerializeToString())
    kind = draw(st.sampled_from(["truncate", "flip", "flip", "insert", "append"]))
    if kind == "truncate" and data:
        return bytes(data[: draw(st.integers(0, len(data) - 1))])
    if kind == "flip" and data:
        for _ in range(draw(st.integers(1, 4))):
            i = draw(st.integers(0, len(data) - 1))
            data[i] ^= 1 << draw(st.integers(0, 7))
        return bytes(data)
    junk = draw(st.binary(min_size=1, max_size=16))
    at = draw(st.integers(0, len(data))) if kind == "insert" else len(data)
    return bytes(data[:at] + junk + data[at:])
