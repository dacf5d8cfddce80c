"""A small writer of TensorFlow tensor-bundle checkpoints, for the importer's tests: valid
checkpoints TensorFlow's fixtures do not cover (several data files, slices spread over
them), and crafted ones (every field of an entry, the table's structure) to check that the
reader refuses them cleanly. It follows TensorFlow's format: a LevelDB table of
``BundleEntryProto`` (header under the empty key, slices under ``EncodeTensorNameSlice``
keys) and ``.data-<i>-of-<n>`` files."""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from embcore._numba.crc32c import crc32c
from embcore.compat._tf_bundle import _slice_key

DTYPES = {np.dtype(np.float32): 1, np.dtype(np.float64): 2, np.dtype(np.int32): 3}
DTYPES |= {np.dtype(np.int64): 9, np.dtype(np.float16): 19}
MAGIC = 0xDB4775248B80FB57


def varint(n: int) -> bytes:
    n &= (1 << 64) - 1  # negative int64 as protobuf writes it
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def fld(number: int, value: int | bytes, fixed32: bool = False) -> bytes:
    if isinstance(value, bytes):
        return varint(number << 3 | 2) + varint(len(value)) + value
    if fixed32:
        return varint(number << 3 | 5) + struct.pack("<I", value)
    return varint(number << 3) + varint(value)


def masked(data: bytes) -> int:
    crc = crc32c(np.frombuffer(data, np.uint8))
    return ((((crc >> 15) | (crc << 17)) & 0xFFFFFFFF) + 0xA282EAD8) & 0xFFFFFFFF


@dataclass
class Entry:
    """The fields of one ``BundleEntryProto`` (``None``: left out)."""

    dtype: int | None = 1
    shape: tuple[int, ...] = ()
    shard_id: int = 0
    offset: int = 0
    size: int = 0
    crc32c: int | None = None
    slices: list[list[tuple[int, int]]] = field(default_factory=list)

    def encode(self) -> bytes:
        out = b"" if self.dtype is None else fld(1, self.dtype)
        out += fld(2, b"".join(fld(2, fld(1, d)) for d in self.shape))
        out += fld(3, self.shard_id) + fld(4, self.offset) + fld(5, self.size)
        if self.crc32c is not None:
            out += fld(6, self.crc32c, fixed32=True)
        for extents in self.slices:
            body = b""
            for start, length in extents:
                body += fld(1, fld(1, start) + (fld(2, length) if length >= 0 else b""))
            out += fld(7, body)
        return out


def header(num_shards: int, endianness: int = 0) -> bytes:
    return fld(1, num_shards) + fld(2, endianness) + fld(3, fld(1, 1))


def table(
    items: dict[bytes, bytes] | list[tuple[bytes, bytes]],
    block_entries: int = 3,
    block_type: int = 0,
) -> bytes:
    """A LevelDB table of ``items`` (written in the given order: sort them for a valid one;
    a list may repeat a key), ``block_entries`` per data block."""
    out = bytearray()
    handles = []

    def block(entries: list[tuple[bytes, bytes]]) -> tuple[int, int]:
        body, restarts = bytearray(), []
        for key, value in entries:
            restarts.append(len(body))
            body += varint(0) + varint(len(key)) + varint(len(value)) + key + value
        for r in restarts:
            body += struct.pack("<I", r)
        body += struct.pack("<I", len(restarts))
        start = len(out)
        out.extend(body)
        out.extend(bytes([block_type]) + struct.pack("<I", masked(bytes(body) + b"\0")))
        return start, len(body)

    pairs = list(items.items()) if isinstance(items, dict) else list(items)
    for i in range(0, len(pairs), block_entries):
        chunk = pairs[i : i + block_entries]
        handles.append((chunk[-1][0], block(chunk)))
    meta = block([])
    index = block([(key, varint(o) + varint(s)) for key, (o, s) in handles])
    footer = varint(meta[0]) + varint(meta[1]) + varint(index[0]) + varint(index[1])
    out += footer.ljust(40, b"\0") + struct.pack("<Q", MAGIC)
    return bytes(out)


@dataclass
class Bundle:
    """A checkpoint being built: ``add`` tensors (whole or sliced) into data files, then
    ``write``. ``entries`` can be edited before writing (crafted checkpoints)."""

    num_shards: int = 1
    entries: dict[bytes, Entry] = field(default_factory=dict)
    data: list[bytearray] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.data = [bytearray() for _ in range(self.num_shards)]

    def _store(self, value: np.ndarray, shard: int) -> Entry:
        raw = np.ascontiguousarray(value).astype(value.dtype.newbyteorder("<")).tobytes()
        entry = Entry(DTYPES[value.dtype], value.shape, shard, len(self.data[shard]), len(raw))
        entry.crc32c = masked(raw)
        self.data[shard] += raw
        return entry

    def add(self, name: str, value: np.ndarray, shard: int = 0) -> None:
        self.entries[name.encode()] = self._store(value, shard)

    def add_sliced(self, name: str, value: np.ndarray, rows: list[int], shards: list[int]):
        """``value`` partitioned by rows at ``rows`` (starts), part ``i`` in ``shards[i]``."""
        stops = [*rows[1:], value.shape[0]]
        slices = []
        for start, stop, shard in zip(rows, stops, shards, strict=True):
            extents = [(start, stop - start)] + [(0, -1)] * (value.ndim - 1)
            self.entries[_slice_key(name, extents)] = self._store(value[start:stop], shard)
            slices.append(extents)
        full = Entry(DTYPES[value.dtype], value.shape, 0, 0, 0, None, slices)
        self.entries[name.encode()] = full

    def write(
        self,
        prefix: Path,
        header_bytes: bytes | None = None,
        with_header: bool = True,
        **table_options,
    ) -> Path:
        items = {b"": header(self.num_shards) if header_bytes is None else header_bytes}
        if not with_header:
            del items[b""]
        items |= {k: e.encode() for k, e in self.entries.items()}
        ordered = dict(sorted(items.items()))
        prefix.parent.mkdir(parents=True, exist_ok=True)
        prefix.with_name(prefix.name + ".index").write_bytes(table(ordered, **table_options))
        for i, data in enumerate(self.data):
            name = f"{prefix.name}.data-{i:05d}-of-{self.num_shards:05d}"
            prefix.with_name(name).write_bytes(bytes(data))
        return prefix
