"""Read TensorFlow checkpoints (the tensor-bundle format) without TensorFlow.

A checkpoint ``prefix`` is two kinds of files (see docs/feature_columns.md, "TensorFlow
checkpoints")::

    prefix.index                   a LevelDB-format table: tensor name -> BundleEntryProto
    prefix.data-00000-of-0000N     the tensors' raw little-endian bytes, back to back; an
    ...                            entry's shard_id says which of the N files holds it

An entry names its dtype, shape, data file, byte offset, size and the masked CRC32C of the
bytes, which is verified as TensorFlow verifies it (an entry without one is refused, as
there). A partitioned variable (``tf.compat.v1`` partitioners, ``ShardedVariable``) has an
entry listing its slices, each stored under an encoded key; they must tile it exactly (no
gap, no overlap, the same dtype) and are put back together here.

Every file is opened as a regular file without following a symbolic link, its size known
before it is read (a FIFO, a link to ``/dev/zero`` or an oversized index is refused at
once), and every malformed byte ends in :class:`CheckpointError` naming the file and, where
there is one, the tensor.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import numpy as np

from embcore._files import UnsafeFileError, open_regular, read_regular
from embcore._numba.crc32c import crc32c
from embcore.compat import _tf_index
from embcore.compat._tf_index import Entry, Malformed

__all__ = [
    "MAX_INDEX_BYTES",
    "CheckpointError",
    "checkpoint_dtypes",
    "checkpoint_shapes",
    "read_checkpoint",
    "read_small_file",
]

#: the largest ``.index`` file read (real ones hold about 100 bytes per tensor)
MAX_INDEX_BYTES = 256 << 20
_DTYPES = {1: np.float32, 2: np.float64, 3: np.int32, 9: np.int64, 19: np.float16}
_DTYPE_NAMES = {7: "string", 14: "bfloat16", 10: "bool"}


class CheckpointError(ValueError):
    """A file that is not a readable TensorFlow checkpoint, naming the file and the problem."""


def read_small_file(path: Path, limit: int, what: str) -> bytes:
    """The bytes of the regular file ``path`` (no symbolic link, FIFO or device; at most
    ``limit`` bytes), or :class:`CheckpointError` naming it and ``what`` it is."""
    try:
        return read_regular(path, limit)
    except UnsafeFileError as e:
        raise CheckpointError(f"{path}: refusing to read the {what}: {e}") from e
    except OSError as e:
        raise CheckpointError(f"{path}: cannot read the {what} ({e})") from e


def dtype_name(code: int) -> str:
    """TensorFlow's name of a ``DataType`` enum value (``float32``, ``int64``, ...)."""
    if code in _DTYPES:
        return np.dtype(_DTYPES[code]).name
    return _DTYPE_NAMES.get(code, f"dtype enum {code}")


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
def _masked_crc32c(data: np.ndarray) -> int:
    crc = crc32c(data)
    return ((((crc >> 15) | (crc << 17)) & 0xFFFFFFFF) + 0xA282EAD8) & 0xFFFFFFFF


class _Bundle:
    """One checkpoint: its index entries and (opened on first use) its data files."""

    def __init__(self, prefix: Path) -> None:
        self.prefix = prefix
        self.index_path = prefix.with_name(prefix.name + ".index")
        raw = read_small_file(self.index_path, MAX_INDEX_BYTES, "checkpoint index")
        try:
            self.entries = _tf_index.table(raw)
            if b"" not in self.entries:
                raise Malformed("no header entry (the empty key)")
            self.num_shards, endianness = _tf_index.header(self.entries[b""])
        except Malformed as e:
            raise CheckpointError(f"{self.index_path}: {e}") from e
        if endianness != 0:  # BundleHeaderProto.endianness: LITTLE = 0
            raise CheckpointError(f"{self.index_path}: big-endian checkpoints are not supported")
        if not 1 <= self.num_shards <= 1 << 20:
            raise CheckpointError(f"{self.index_path}: the header names {self.num_shards} files")
        self._shards: dict[int, np.ndarray | bytes] = {}
        self._paths: dict[int, Path] = {}

    def entry(self, key: bytes, name: str) -> Entry:
        try:
            return _tf_index.entry(self.entries[key])
        except Malformed as e:
            raise CheckpointError(f"{self.index_path}: tensor '{name}': {e}") from e

    def names(self) -> dict[str, Entry]:
        """``{name: entry}`` of every tensor (not the header, not the slices' own keys)."""
        return {
            key.decode("utf-8", "replace"): self.entry(key, key.decode("utf-8", "replace"))
            for key in self.entries
            if key and not key.startswith(b"\x00")
        }

    def _shard(self, shard_id: int, name: str) -> np.ndarray | bytes:
        if shard_id >= self.num_shards:
            raise CheckpointError(
                f"{self.index_path}: tensor '{name}' is in data file {shard_id}, the "
                f"checkpoint has {self.num_shards}"
            )
        if shard_id not in self._shards:
            suffix = f".data-{shard_id:05d}-of-{self.num_shards:05d}"
            path = self.prefix.with_name(self.prefix.name + suffix)
            try:
                fd, size = open_regular(path)
            except UnsafeFileError as e:
                raise CheckpointError(f"{path}: refusing to read the checkpoint data: {e}") from e
            except OSError as e:
                raise CheckpointError(f"{path}: cannot read the checkpoint data ({e})") from e
            with os.fdopen(fd, "rb") as f:  # the map keeps its own reference to the file
                data = np.memmap(f, dtype=np.uint8, mode="r") if size else b""
            self._shards[shard_id], self._paths[shard_id] = data, path
        return self._shards[shard_id]

    def check_bytes(self, e: Entry, name: str, shape: tuple[int, ...]) -> None:
        """Refuse an entry whose size is not what its dtype and ``shape`` need, or whose bytes
        lie past the end of its data file (before anything is allocated or read)."""
        where = f"{self.prefix}: tensor '{name}'"
        dtype = _DTYPES.get(e.dtype)
        if dtype is None:
            raise CheckpointError(f"{where} has dtype {dtype_name(e.dtype)}, not a number type")
        need = math.prod(shape) * np.dtype(dtype).itemsize
        if e.size != need:
            raise CheckpointError(
                f"{where} stores {e.size} bytes, its shape {list(shape)} of "
                f"{dtype_name(e.dtype)} needs {need}"
            )
        data = self._shard(e.shard_id, name)
        if e.offset + e.size > len(data):
            raise CheckpointError(
                f"{where} runs past the end of its data file (bytes {e.offset} to "
                f"{e.offset + e.size} of {len(data)})"
            )

    def tensor(self, e: Entry, name: str) -> np.ndarray:
        """The values of one stored entry (checked with :meth:`check_bytes` first)."""
        self.check_bytes(e, name, e.shape)
        data = self._shard(e.shard_id, name)
        if isinstance(data, bytes):  # an empty data file (only empty tensors fit in it)
            raw = np.frombuffer(data, np.uint8, count=e.size, offset=e.offset)
        else:
            raw = np.asarray(data[e.offset : e.offset + e.size])
        if _masked_crc32c(raw) != e.crc32c:
            problem = (
                "fails its CRC32C check (corrupt data)"
                if e.has_crc
                else "has no CRC32C (TensorFlow refuses such an entry too)"
            )
            raise CheckpointError(f"{self._paths[e.shard_id]}: tensor '{name}' {problem}")
        dtype = np.dtype(_DTYPES[e.dtype]).newbyteorder("<")
        return raw.view(dtype).reshape(e.shape).copy()

    def read(self, name: str) -> np.ndarray:
        key = name.encode()
        if key not in self.entries or not key:
            raise CheckpointError(f"{self.prefix}: no tensor '{name}' in the checkpoint")
        e = self.entry(key, name)
        if not e.slices:
            return self.tensor(e, name)
        return self._assemble(e, name)

    def _assemble(self, full: Entry, name: str) -> np.ndarray:
        """A partitioned tensor from its slices, which must tile it exactly."""
        where = f"{self.prefix}: tensor '{name}'"
        if _DTYPES.get(full.dtype) is None:
            raise CheckpointError(f"{where} has dtype {dtype_name(full.dtype)}, not a number type")
        boxes, parts = [], []
        for extents in full.slices:
            if len(extents) > len(full.shape):
                raise CheckpointError(f"{where}: slice {extents} has more dims than the tensor")
            padded = extents + [(0, -1)] * (len(full.shape) - len(extents))
            box = []
            for (start, length), dim in zip(padded, full.shape, strict=True):
                stop = dim if length < 0 else start + length
                if start < 0 or stop > dim or (length < 0 and start != 0):
                    raise CheckpointError(f"{where}: slice {extents} lies outside {full.shape}")
                box.append((start, stop))
            key = _slice_key(name, extents)
            if key not in self.entries:
                raise CheckpointError(f"{where}: slice {extents} is missing")
            part = self.entry(key, name)
            shape = tuple(b - a for a, b in box)
            if part.dtype != full.dtype or part.shape != shape or part.slices:
                raise CheckpointError(
                    f"{where}: slice {extents} holds {dtype_name(part.dtype)} of shape "
                    f"{list(part.shape)}, expected {dtype_name(full.dtype)} of shape {list(shape)}"
                )
            self.check_bytes(part, name, shape)
            boxes.append(box)
            parts.append(part)
        _check_tiling(boxes, full.shape, where)
        out = np.empty(full.shape, dtype=_DTYPES[full.dtype])
        for box, part in zip(boxes, parts, strict=True):
            out[tuple(slice(a, b) for a, b in box)] = self.tensor(part, name)
        return out


def _check_tiling(boxes: list[list[tuple[int, int]]], shape: tuple[int, ...], where: str) -> None:
    """Refuse slices that overlap or leave a gap (their volumes must add up to the tensor's,
    and no two may intersect)."""
    total = sum(math.prod(b - a for a, b in box) for box in boxes)
    ordered = sorted(boxes)
    for i, box in enumerate(ordered):
        for other in ordered[i + 1 :]:
            if other[0][0] >= box[0][1]:
                break  # sorted by first-dim start: no later box reaches back into this one
            if all(a < d and c < b for (a, b), (c, d) in zip(box, other, strict=True)):
                raise CheckpointError(f"{where}: slices {box} and {other} overlap")
    if total != math.prod(shape):
        raise CheckpointError(
            f"{where}: the slices hold {total} of its {math.prod(shape)} values (a slice is "
            "missing from the entry)"
        )


def _numeric(entry: Entry) -> bool:
    return entry.dtype != 7  # strings: the object graph and other bookkeeping


def checkpoint_shapes(prefix: str | Path) -> dict[str, tuple[int, ...]]:
    """``{name: shape}`` of every tensor of a checkpoint but strings, read from its index."""
    return {n: e.shape for n, e in _Bundle(Path(prefix)).names().items() if _numeric(e)}


def checkpoint_dtypes(prefix: str | Path) -> dict[str, str]:
    """``{name: dtype name}`` of every tensor of a checkpoint but strings (``float32``...)."""
    return {n: dtype_name(e.dtype) for n, e in _Bundle(Path(prefix)).names().items() if _numeric(e)}


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
        CheckpointError: a missing, unsafe or malformed file, a failed or missing checksum,
            an unknown name, or a tensor whose slices do not tile it; the message names the
            file and the tensor.
    """
    bundle = _Bundle(Path(prefix))
    if names is None:
        names = [n for n, e in bundle.names().items() if _numeric(e)]
    return {name: bundle.read(name) for name in names}
