"""One msgpack codec for typed messages: a message is the array `[kind, field_1, field_2, ...]`.

Each channel family (the server's processes, the tensor-parallel ranks) lists its message
dataclasses once; the position in that list is the kind on the wire. Only plain values travel
(ints, floats, strings, bytes, lists, dicts), never pickle. A field may hold a typed record (a
dataclass such as `SamplingParams` or `ReqOutput`), or a list of them: it says so with
`record(Cls)` / `records(Cls)` and travels as the record's fields in order.
"""

from __future__ import annotations

from dataclasses import Field, field, fields
from typing import Any

import msgpack

from radixkv.errors import RadixKVError


class ProtocolError(RadixKVError):
    """A message that is not one of ours (unknown kind, wrong number of fields, not msgpack), or
    one of ours whose values are invalid (then `kind` and `values` say which, so its receiver
    can answer the request it was for)."""

    def __init__(self, message: str, kind: type | None = None, values: list | None = None):
        super().__init__(message)
        self.kind, self.values = kind, values


def record(cls: type, **kw: Any) -> Any:
    """A message field holding one `cls` record (or None)."""
    return field(metadata={"record": cls}, **kw)


def records(cls: type, **kw: Any) -> Any:
    """A message field holding a list of `cls` records."""
    return field(metadata={"records": cls}, **kw)


def _row(value: Any) -> list:
    to_row = getattr(value, "to_row", None)
    return to_row() if to_row is not None else [getattr(value, f.name) for f in fields(value)]


def _build(cls: type, row: list) -> Any:
    from_row = getattr(cls, "from_row", None)
    return from_row(row) if from_row is not None else cls(*row)


class MessageCodec:
    """Encodes and decodes the dataclasses in `kinds` (frozen, plain-valued or record fields)."""

    def __init__(self, kinds: tuple[type, ...], channel: str):
        self.kinds, self.channel = kinds, channel
        self._kind_of = {cls: i for i, cls in enumerate(kinds)}
        self._fields: dict[type, tuple[Field, ...]] = {cls: fields(cls) for cls in kinds}

    def encode(self, msg: Any) -> bytes:
        try:
            kind = self._kind_of[type(msg)]
        except KeyError:
            raise ProtocolError(f"{type(msg).__name__} is not a {self.channel} message") from None
        values = []
        for f in self._fields[type(msg)]:
            value = getattr(msg, f.name)
            if "record" in f.metadata and value is not None:
                value = _row(value)
            elif "records" in f.metadata:
                value = [_row(v) for v in value]
            values.append(value)
        try:
            return msgpack.packb([kind, *values], use_bin_type=True)
        except (TypeError, ValueError, OverflowError) as e:
            raise ProtocolError(f"{type(msg).__name__} holds a value msgpack cannot carry: {e}") from None

    def decode(self, data: bytes) -> Any:
        try:
            kind, *values = msgpack.unpackb(data, raw=False, strict_map_key=True)
        except (ValueError, TypeError, msgpack.ExtraData, msgpack.FormatError, msgpack.StackError) as e:
            raise ProtocolError(f"undecodable message: {e}") from None
        if not isinstance(kind, int) or not 0 <= kind < len(self.kinds):
            raise ProtocolError(f"unknown message kind {kind!r}")
        cls = self.kinds[kind]
        specs = self._fields[cls]
        if len(values) != len(specs):
            raise ProtocolError(f"{cls.__name__} takes {len(specs)} fields, got {len(values)}")
        try:
            for i, f in enumerate(specs):
                if "record" in f.metadata and values[i] is not None:
                    values[i] = _build(f.metadata["record"], values[i])
                elif "records" in f.metadata:
                    values[i] = [_build(f.metadata["records"], row) for row in values[i]]
            return cls(*values)
        except (TypeError, ValueError, RadixKVError) as e:
            raise ProtocolError(f"malformed {cls.__name__}: {e}", cls, values) from None
