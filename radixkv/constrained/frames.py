"""Frames between the scheduler and its grammar compiler process: a 4-byte big-endian length,
then one msgpack value (plain values only, never pickle)."""

from __future__ import annotations

import struct
from typing import Any, BinaryIO

import msgpack

LENGTH = struct.Struct(">I")


def write_frame(stream: BinaryIO, obj: Any) -> None:
    data = msgpack.packb(obj, use_bin_type=True)
    stream.write(LENGTH.pack(len(data)) + data)
    stream.flush()


def read_frame(stream: BinaryIO) -> Any | None:
    """The next frame, or None at end of stream."""
    head = stream.read(LENGTH.size)
    if len(head) < LENGTH.size:
        return None
    (n,) = LENGTH.unpack(head)
    data = stream.read(n)
    return msgpack.unpackb(data, raw=False) if len(data) == n else None


def split_frames(buffer: bytearray) -> list[Any]:
    """The complete frames at the start of `buffer`, which loses them (a partial one stays)."""
    out = []
    while len(buffer) >= LENGTH.size:
        (n,) = LENGTH.unpack_from(buffer)
        if len(buffer) < LENGTH.size + n:
            break
        out.append(msgpack.unpackb(bytes(buffer[LENGTH.size:LENGTH.size + n]), raw=False))
        del buffer[:LENGTH.size + n]
    return out
