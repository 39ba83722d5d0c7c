"""One msgpack codec for typed messages: a message is the array `[kind, field_1, field_2, ...]`.

Each channel family (the server's processes, the tensor-parallel ranks) lists its message
dataclasses once; the position in that list is the kind on the wire. Only plain values travel
(ints, floats, strings, bytes, lists, dicts), never pickle.
"""

from __future__ import annotations

from dataclasses import fields
from typing import Any

import msgpack

from radixkv.errors import RadixKVError


class ProtocolError(RadixKVError):
    """A message that is not one of ours (unknown kind, wrong number of fields, not msgpack)."""


class MessageCodec:
    """Encodes and decodes the dataclasses in `kinds` (frozen, plain-valued fields)."""

    def __init__(self, kinds: tuple[type, ...], channel: str):
        self.kinds, self.channel = kinds, channel
        self._kind_of = {cls: i for i, cls in enumerate(kinds)}
        self._num_fields = {cls: len(fields(cls)) for cls in kinds}

    def encode(self, msg: Any) -> bytes:
        try:
            kind = self._kind_of[type(msg)]
        except KeyError:
            raise ProtocolError(f"{type(msg).__name__} is not a {self.channel} message") from None
        return msgpack.packb([kind, *(getattr(msg, f.name) for f in fields(msg))], use_bin_type=True)

    def decode(self, data: bytes) -> Any:
        try:
            kind, *values = msgpack.unpackb(data, raw=False, strict_map_key=True)
        except (ValueError, TypeError, msgpack.ExtraData, msgpack.FormatError, msgpack.StackError) as e:
            raise ProtocolError(f"undecodable message: {e}") from None
        if not isinstance(kind, int) or not 0 <= kind < len(self.kinds):
            raise ProtocolError(f"unknown message kind {kind!r}")
        cls = self.kinds[kind]
        if len(values) != self._num_fields[cls]:
            raise ProtocolError(f"{cls.__name__} takes {self._num_fields[cls]} fields, got {len(values)}")
        return cls(*values)
