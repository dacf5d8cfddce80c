"""The bytes of a TensorFlow checkpoint's ``.index`` file, parsed with every bound checked.

The index is a LevelDB-format table (sorted keys, prefix-compressed blocks, an index block
and a 48-byte footer ending in a magic number) mapping each tensor name to a protobuf
``BundleEntryProto``; the empty key holds the ``BundleHeaderProto``. The few protobuf fields
involved are read with a small varint reader rather than a protobuf dependency. Whatever the
bytes, a function here returns or raises :class:`Malformed` (the caller names the file):
no read past a buffer, no endless loop, no negative size. See docs/feature_columns.md.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

__all__ = ["Entry", "Malformed", "entry", "fields", "header", "table"]

_MAGIC = 0xDB4775248B80FB57  # LevelDB table magic, the last 8 bytes of an .index file
_FOOTER = 48
_MAX_VARINT = 10


class Malformed(ValueError):
    """Bytes that are not what they should be (the message says what, not where)."""


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    result = 0
    for i in range(_MAX_VARINT):
        if pos >= len(buf):
            raise Malformed("a varint runs past the end of its buffer")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << (7 * i)
        if not b & 0x80:
            return result, pos
    raise Malformed(f"a varint longer than {_MAX_VARINT} bytes")


def fields(buf: bytes) -> list[tuple[int, int | bytes]]:
    """``[(field number, value)]`` of a protobuf message: ints for wire types 0, 1 and 5,
    bytes for length-delimited fields (2)."""
    out: list[tuple[int, int | bytes]] = []
    pos = 0
    while pos < len(buf):
        key, pos = _varint(buf, pos)
        number, wire = key >> 3, key & 7
        if number == 0:
            raise Malformed("a protobuf field numbered 0")
        value: int | bytes
        if wire == 0:
            value, pos = _varint(buf, pos)
        elif wire in (1, 5):
            width = 8 if wire == 1 else 4
            if pos + width > len(buf):
                raise Malformed("a fixed-width protobuf field runs past the end")
            value = int.from_bytes(buf[pos : pos + width], "little")
            pos += width
        elif wire == 2:
            size, pos = _varint(buf, pos)
            if pos + size > len(buf):
                raise Malformed("a length-delimited protobuf field runs past the end")
            value, pos = bytes(buf[pos : pos + size]), pos + size
        else:
            raise Malformed(f"unsupported protobuf wire type {wire}")
        out.append((number, value))
    return out


def _int(value: int | bytes, what: str, signed: bool = False) -> int:
    if not isinstance(value, int):
        raise Malformed(f"{what} is not an integer field")
    if signed and value >= 1 << 63:
        value -= 1 << 64
    return value


def _message(value: int | bytes, what: str) -> bytes:
    if not isinstance(value, bytes):
        raise Malformed(f"{what} is not a message")
    return value


@dataclass(frozen=True)
class Entry:
    """A ``BundleEntryProto``: where one tensor (or one slice of one) is stored.

    Attributes:
        dtype: TensorFlow's ``DataType`` enum value.
        shape: the dims (each >= 0).
        shard_id, offset, size: the data file ``prefix.data-<shard_id>-of-<N>`` and the byte
            range there.
        crc32c: the masked CRC32C of those bytes (0 when the field is absent, as protobuf
            reads it: TensorFlow then refuses the entry, and so does embcore).
        has_crc: whether the field was present.
        slices: for a partitioned tensor, each slice's extents ``[(start, length)]`` (length
            -1: the whole dim).
    """

    dtype: int = 0
    shape: tuple[int, ...] = ()
    shard_id: int = 0
    offset: int = 0
    size: int = 0
    crc32c: int = 0
    has_crc: bool = False
    slices: list[list[tuple[int, int]]] = field(default_factory=list)


def _shape(buf: bytes) -> tuple[int, ...]:
    dims = []
    for number, value in fields(buf):
        if number == 2:  # TensorShapeProto.dim -> Dim: size (1), name (2)
            size = 0
            for n, v in fields(_message(value, "a shape's dim")):
                if n == 1:
                    size = _int(v, "a dim's size", signed=True)
            if size < 0:
                raise Malformed(f"a dim of size {size}")
            dims.append(size)
        elif number == 3 and value:  # unknown_rank
            raise Malformed("a shape of unknown rank")
    return tuple(dims)


def _extents(buf: bytes) -> list[tuple[int, int]]:
    out = []
    for number, value in fields(buf):
        if number == 1:  # TensorSliceProto.extent -> start (1), length (2)
            start, length = 0, -1
            for n, v in fields(_message(value, "a slice's extent")):
                if n == 1:
                    start = _int(v, "an extent's start", signed=True)
                elif n == 2:
                    length = _int(v, "an extent's length", signed=True)
                    if length < 0:
                        raise Malformed(f"an extent of length {length}")
            out.append((start, length))
    return out


def entry(buf: bytes) -> Entry:
    """Parse a ``BundleEntryProto``."""
    values: dict = {"slices": []}
    for number, value in fields(buf):
        if number == 1:
            values["dtype"] = _int(value, "the dtype")
        elif number == 2:
            values["shape"] = _shape(_message(value, "the shape"))
        elif number in (3, 4, 5):
            name = {3: "shard_id", 4: "offset", 5: "size"}[number]
            values[name] = _int(value, name, signed=True)
            if values[name] < 0:
                raise Malformed(f"a negative {name} ({values[name]})")
        elif number == 6:
            values["crc32c"], values["has_crc"] = _int(value, "the crc32c") & 0xFFFFFFFF, True
        elif number == 7:
            values["slices"].append(_extents(_message(value, "a slice")))
    return Entry(**values)


def header(buf: bytes) -> tuple[int, int]:
    """``(num_shards, endianness)`` of a ``BundleHeaderProto`` (0 is little-endian)."""
    values = {1: 1, 2: 0}
    for number, value in fields(buf):
        if number in values:
            values[number] = _int(value, "a header field")
    return values[1], values[2]


def _handle(buf: bytes, pos: int, limit: int) -> tuple[int, int, int]:
    """A block handle ``(offset, size)`` read at ``pos``, checked to lie in ``[0, limit)``
    with its 5-byte trailer; and the position after it."""
    offset, pos = _varint(buf, pos)
    size, pos = _varint(buf, pos)
    if offset + size + 5 > limit:
        raise Malformed(f"a block at byte {offset} of {size} bytes runs past the table's data")
    return offset, size, pos


def _block(data: bytes, handle: bytes, limit: int) -> bytes:
    offset, size, _ = _handle(handle, 0, limit)
    kind = data[offset + size]
    if kind != 0:
        raise Malformed(f"compressed table blocks (type {kind}) are not supported")
    return data[offset : offset + size]


def _block_entries(block: bytes) -> list[tuple[bytes, bytes]]:
    """The (key, value) pairs of one block (keys share prefixes with the previous one)."""
    if len(block) < 4:
        raise Malformed("a table block shorter than its restart count")
    restarts = struct.unpack_from("<I", block, len(block) - 4)[0]
    end = len(block) - 4 - 4 * restarts
    if end < 0:
        raise Malformed(f"a table block of {len(block)} bytes claims {restarts} restarts")
    out, pos, key = [], 0, b""
    while pos < end:
        shared, pos = _varint(block, pos)
        unshared, pos = _varint(block, pos)
        size, pos = _varint(block, pos)
        if shared > len(key) or pos + unshared + size > end:
            raise Malformed("a table entry runs past its block")
        key = key[:shared] + block[pos : pos + unshared]
        pos += unshared
        out.append((key, block[pos : pos + size]))
        pos += size
    return out


def table(data: bytes) -> dict[bytes, bytes]:
    """``{key: value}`` of every entry of a LevelDB table's bytes, keys strictly ascending.

    Raises:
        Malformed: no table magic, a block or entry out of bounds, a compressed block, keys
            out of order or repeated.
    """
    if len(data) < _FOOTER or struct.unpack_from("<Q", data, len(data) - 8)[0] != _MAGIC:
        raise Malformed("not a TensorFlow checkpoint index (no table magic)")
    limit = len(data) - _FOOTER
    footer = data[limit:]
    _, _, pos = _handle(footer, 0, limit)  # the metaindex block (unused)
    index_block = _block(data, footer[pos:], limit)
    entries: dict[bytes, bytes] = {}
    last: bytes | None = None
    for _, handle in _block_entries(index_block):
        for key, value in _block_entries(_block(data, handle, limit)):
            if last is not None and key <= last:
                raise Malformed(f"the table's keys are out of order or repeated at {key!r}")
            entries[key] = value
            last = key
    return entries
