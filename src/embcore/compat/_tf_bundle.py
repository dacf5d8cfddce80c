"""Read TensorFlow checkpoints (the tensor-bundle format) without TensorFlow.

A checkpoint ``prefix`` is two kinds of files (see docs/feature_columns.md, "TensorFlow
checkpoints")::

    prefix.index                   a LevelDB-format table: tensor name -> BundleEntryProto
    prefix.data-00000-of-00001     the tensors' raw little-endian bytes, back to back

An entry names its dtype, shape, data shard, byte offset, size and the masked CRC32C of the
bytes, which is verified. A partitioned variable (``tf.compat.v1`` partitioners,
``ShardedVariable``) has an entry listing its slices, each stored under an encoded key; they
are put back together here. The three protobuf messages involved are read with a small varint
reader (a handful of fields) rather than a protobuf dependency.
"""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np

from embcore.ops.cpu.crc32c import crc32c

__all__ = ["CheckpointError", "checkpoint_shapes", "read_checkpoint"]

_MAGIC = 0xDB4775248B80FB57  # LevelDB table magic, the last 8 bytes of an .index file
_DTYPES = {1: np.float32, 2: np.float64, 3: np.int32, 9: np.int64, 19: np.float16}
_DTYPE_NAMES = {7: "string", 14: "bfloat16", 10: "bool"}


class CheckpointError(ValueError):
    """A file that is not a readable TensorFlow checkpoint, naming the file and the problem."""


# ------------------------------------------------------------------------------ protobuf
def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7


def _fields(buf: bytes) -> list[tuple[int, object]]:
    """``[(field number, value)]`` of a protobuf message: ints, or bytes for length-delimited
    fields (wire types 0, 1, 2 and 5)."""
    out, pos = [], 0
    while pos < len(buf):
        key, pos = _varint(buf, pos)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _varint(buf, pos)
        elif wire == 1:
            value, pos = struct.unpack_from("<Q", buf, pos)[0], pos + 8
        elif wire == 5:
            value, pos = struct.unpack_from("<I", buf, pos)[0], pos + 4
        elif wire == 2:
            size, pos = _varint(buf, pos)
            value, pos = buf[pos : pos + size], pos + size
        else:
            raise ValueError(f"unsupported protobuf wire type {wire}")
        out.append((number, value))
    return out


def _int64(v: int) -> int:
    return v - (1 << 64) if v >= 1 << 63 else v


def _entry(buf: bytes) -> dict:
    """A ``BundleEntryProto``: dtype, shape, shard_id, offset, size, crc32c, slices."""
    entry = {"dtype": 0, "shape": [], "shard_id": 0, "offset": 0, "size": 0, "crc32c": None}
    entry["slices"] = []
    for number, value in _fields(buf):
        if number == 1:
            entry["dtype"] = value
        elif number == 2:  # TensorShapeProto: dim (2) -> Dim: size (1)
            dims = [dict(_fields(d)) for n, d in _fields(value) if n == 2]  # type: ignore[arg-type]
            entry["shape"] = [_int64(d.get(1, 0)) for d in dims]
        elif number in (3, 4, 5):
            entry[{3: "shard_id", 4: "offset", 5: "size"}[number]] = value
        elif number == 6:
            entry["crc32c"] = value
        elif number == 7:  # TensorSliceProto: extent (1) -> start (1), length (2)
            extents = [dict(_fields(e)) for n, e in _fields(value) if n == 1]  # type: ignore[arg-type]
            entry["slices"].append([(_int64(e.get(1, 0)), _int64(e.get(2, -1))) for e in extents])
    return entry


# -------------------------------------------------------------------------------- crc32c
def _masked_crc32c(data: np.ndarray) -> int:
    crc = crc32c(data)
    return ((((crc >> 15) | (crc << 17)) & 0xFFFFFFFF) + 0xA282EAD8) & 0xFFFFFFFF


# --------------------------------------------------------------------------- the table
def _block_entries(block: bytes) -> list[tuple[bytes, bytes]]:
    """The (key, value) pairs of one table block (keys share prefixes with the previous)."""
    restarts = struct.unpack_from("<I", block, len(block) - 4)[0]
    end = len(block) - 4 - 4 * restarts
    out, pos, key = [], 0, b""
    while pos < end:
        shared, pos = _varint(block, pos)
        unshared, pos = _varint(block, pos)
        size, pos = _varint(block, pos)
        key = key[:shared] + block[pos : pos + unshared]
        pos += unshared
        out.append((key, block[pos : pos + size]))
        pos += size
    return out


def _read_block(data: bytes, handle: bytes, path: Path) -> bytes:
    offset, pos = _varint(handle, 0)
    size, _ = _varint(handle, pos)
    block = data[offset : offset + size]
    kind = data[offset + size]
    if kind != 0:
        raise CheckpointError(f"{path}: compressed table blocks (type {kind}) are not supported")
    return block


def _index(path: Path) -> dict[bytes, bytes]:
    """``{key: value}`` of every entry in the ``.index`` table."""
    try:
        data = path.read_bytes()
    except OSError as e:
        raise CheckpointError(f"{path}: cannot read the checkpoint index ({e})") from e
    if len(data) < 48 or struct.unpack_from("<Q", data, len(data) - 8)[0] != _MAGIC:
        raise CheckpointError(f"{path}: not a TensorFlow checkpoint index (no table magic)")
    footer = data[-48:]
    _, pos = _varint(footer, 0)
    _, pos = _varint(footer, pos)  # the metaindex handle (unused)
    index_block = _read_block(data, footer[pos:], path)
    entries: dict[bytes, bytes] = {}
    for _, handle in _block_entries(index_block):
        entries.update(_block_entries(_read_block(data, handle, path)))
    return entries


# ------------------------------------------------------------------------ slice keys
def _num_increasing(v: int) -> bytes:
    body = v.to_bytes((v.bit_length() + 7) // 8, "big") if v else b""
    return bytes([len(body)]) + body


_HEADER_BITS = [(0, 0), (0x80, 0), (0xC0, 0), (0xE0, 0), (0xF0, 0), (0xF8, 0), (0xFC, 0)]
_HEADER_BITS += [(0xFE, 0), (0xFF, 0), (0xFF, 0x80), (0xFF, 0xC0)]


def _signed_num_increasing(v: int) -> bytes:
    x = ~v if v < 0 else v
    n = x.bit_length() // 7 + 1
    if n == 1:
        return bytes([(0x80 ^ v) & 0xFF])
    body = bytearray((v & ((1 << (8 * n)) - 1)).to_bytes(n, "big"))
    body[0] ^= _HEADER_BITS[n][0]
    body[1] ^= _HEADER_BITS[n][1]
    return bytes(body)


def _slice_key(name: str, extents: list[tuple[int, int]]) -> bytes:
    """TensorFlow's ``EncodeTensorNameSlice``: where one slice of a partitioned variable is."""
    escaped = bytearray()
    for c in name.encode():  # OrderedCode's string escapes: 0x00 -> 00 ff, 0xff -> ff 00
        escaped += {0: b"\x00\xff", 0xFF: b"\xff\x00"}.get(c, bytes([c]))
    key = _num_increasing(0) + escaped + b"\x00\x01" + _num_increasing(len(extents))
    for start, length in extents:
        key += _signed_num_increasing(start) + _signed_num_increasing(length)
    return key


# ------------------------------------------------------------------------------ reading
def _tensor(prefix: Path, entry: dict, name: str, shards: dict) -> np.ndarray:
    dtype = _DTYPES.get(entry["dtype"])
    if dtype is None:
        kind = _DTYPE_NAMES.get(entry["dtype"], f"enum {entry['dtype']}")
        raise CheckpointError(f"{prefix}: tensor '{name}' has dtype {kind}, not a number type")
    data = shards[entry["shard_id"]][entry["offset"] : entry["offset"] + entry["size"]]
    raw = np.asarray(np.frombuffer(data, dtype=np.uint8) if isinstance(data, bytes) else data)
    if len(raw) != entry["size"]:
        raise CheckpointError(f"{prefix}: tensor '{name}' runs past the end of its data file")
    if entry["crc32c"] is not None and _masked_crc32c(raw) != entry["crc32c"]:
        raise CheckpointError(f"{prefix}: tensor '{name}' fails its CRC32C check (corrupt data)")
    return raw.view(np.dtype(dtype).newbyteorder("<")).reshape(entry["shape"]).copy()


def _entries(prefix: Path) -> dict[bytes, bytes]:
    entries = _index(prefix.with_name(prefix.name + ".index"))
    header = dict(_fields(entries.get(b"", b"")))
    if header.get(2, 0) != 0:  # BundleHeaderProto.endianness: LITTLE = 0
        raise CheckpointError(f"{prefix}: big-endian checkpoints are not supported")
    return entries


def checkpoint_shapes(prefix: str | Path) -> dict[str, tuple[int, ...]]:
    """``{name: shape}`` of every numeric tensor of a checkpoint, read from its index only."""
    out = {}
    for key, value in _entries(Path(prefix)).items():
        if key and not key.startswith(b"\x00"):  # not the header, not one slice of a tensor
            entry = _entry(value)
            if entry["dtype"] != 7:  # strings: the object graph and other bookkeeping
                out[key.decode("utf-8", "replace")] = tuple(entry["shape"])
    return out


def read_checkpoint(prefix: str | Path, names: list[str] | None = None) -> dict[str, np.ndarray]:
    """Numeric tensors of a TensorFlow checkpoint, partitioned ones put back together.

    Args:
        prefix: the checkpoint prefix (``.../model.ckpt-7``, ``.../ckpt-1``), without
            ``.index``.
        names: the tensors to read (see :func:`checkpoint_shapes`); ``None`` reads them all.
            The data files are memory-mapped, so only these tensors are read from disk.

    Returns:
        ``{name: array}`` with the stored dtypes and shapes; string tensors (the object graph)
        are left out.

    Raises:
        CheckpointError: a missing or unreadable file, a failed checksum, an unknown name, or
            a tensor whose slices do not cover it.
    """
    prefix = Path(prefix)
    entries = _entries(prefix)
    num_shards = int(dict(_fields(entries.get(b"", b""))).get(1, 1))  # type: ignore[arg-type]
    shards = {}
    for i in range(num_shards):
        path = prefix.with_name(f"{prefix.name}.data-{i:05d}-of-{num_shards:05d}")
        try:
            size = path.stat().st_size
            shards[i] = np.memmap(path, dtype=np.uint8, mode="r") if size else b""
        except OSError as e:
            raise CheckpointError(f"{path}: cannot read the checkpoint data ({e})") from e
    wanted = list(checkpoint_shapes(prefix)) if names is None else names
    out: dict[str, np.ndarray] = {}
    for name in wanted:
        value = entries.get(name.encode())
        if value is None:
            raise CheckpointError(f"{prefix}: no tensor '{name}' in the checkpoint")
        entry = _entry(value)
        if not entry["slices"]:
            out[name] = _tensor(prefix, entry, name, shards)
            continue
        full = np.zeros(entry["shape"], dtype=_DTYPES.get(entry["dtype"], np.float32))
        covered = np.zeros(entry["shape"] or [1], dtype=bool)  # every element: rows and columns
        for extents in entry["slices"]:
            part_key = _slice_key(name, extents)
            if part_key not in entries:
                raise CheckpointError(f"{prefix}: slice {extents} of tensor '{name}' is missing")
            where = tuple(
                slice(None) if n < 0 else slice(s, s + n)
                for s, n in extents + [(0, -1)] * (full.ndim - len(extents))
            )
            full[where] = _tensor(prefix, _entry(entries[part_key]), name, shards)
            covered[where] = True
        if not covered.all():
            raise CheckpointError(f"{prefix}: the slices of tensor '{name}' do not cover it")
        out[name] = full
    return out
