"""One disk table's working file: fixed-size records, read and written by row.

A record holds one row and its optimizer slots::

    offset 0   magic   uint32   RECORD_MAGIC once written (a hole in the sparse file reads 0)
           4   spare   uint32
           8   id      int64    the row's id (a record read from the wrong place is caught)
          16   weight  (dim,) float32
               slots   each (dim,) or () float32, in the optimizer's slot order
               padding to a multiple of 512 bytes (the unit of O_DIRECT transfers)

Record ``i`` sits at byte ``i * record_bytes``; the file is created sparse at its full size,
so rows never written take no disk. With ``O_DIRECT`` nothing goes through the page cache;
without it (a file system that refuses ``O_DIRECT``) the pages read are dropped at once with
``posix_fadvise`` and written ones after each write. Requests run on ``io_threads`` threads
(the disk's queue depth); runs of consecutive records are one request. A lock file
(``flock``) keeps a second engine off the directory; the kernel releases it when the process
dies, so a crashed run's directory can be used again. See docs/disk_tables.md.
"""

from __future__ import annotations

import errno
import fcntl
import mmap
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

__all__ = ["RECORD_MAGIC", "DiskTableError", "RecordLayout", "RowFile"]

RECORD_MAGIC = 0x52424D45  # "EMBR"
_ALIGN = 512
_HEADER = 16
#: requests smaller than this many runs are issued on the calling thread
_INLINE_RUNS = 4


class DiskTableError(OSError):
    """A disk table's file or directory cannot be used as it should (full disk, read-only
    file system, truncated or unreadable file, another engine on the directory)."""

    def __str__(self) -> str:
        return str(self.strerror)


@dataclass(frozen=True)
class RecordLayout:
    """The record of a table with rows of ``dim`` float32 and the given slot shapes
    (``()`` for one value per row, ``(dim,)`` for one per element)."""

    dim: int
    slots: tuple[tuple[str, tuple[int, ...]], ...]

    @property
    def dtype(self) -> np.dtype:
        names, formats, offsets = ["magic", "spare", "id", "weight"], [], []
        formats += [np.uint32, np.uint32, np.int64, (np.float32, (self.dim,))]
        offsets += [0, 4, 8, _HEADER]
        at = _HEADER + 4 * self.dim
        for name, shape in self.slots:
            names.append(f"slot_{name}")
            formats.append((np.float32, shape) if shape else np.float32)
            offsets.append(at)
            at += 4 * (shape[0] if shape else 1)
        size = -(-at // _ALIGN) * _ALIGN
        return np.dtype({"names": names, "formats": formats, "offsets": offsets, "itemsize": size})

    @property
    def payload_bytes(self) -> int:
        """Bytes of a record that carry values (the rest is header and padding)."""
        return 4 * (self.dim + sum(s[0] if s else 1 for _, s in self.slots))


def aligned(records: int, dtype: np.dtype) -> np.ndarray:
    """A zeroed ``(records,)`` array of ``dtype`` on page-aligned memory (``O_DIRECT``)."""
    buffer = mmap.mmap(-1, max(1, records) * dtype.itemsize)
    return np.frombuffer(buffer, dtype=dtype, count=records)


_pools: dict[int, ThreadPoolExecutor] = {}


def _pool(threads: int) -> ThreadPoolExecutor:
    if threads not in _pools:
        _pools[threads] = ThreadPoolExecutor(threads, thread_name_prefix="embcore-disk-io")
    return _pools[threads]


class RowFile:
    """The working file of table ``table`` (``rows`` records of ``layout``) in ``directory``.

    Opening takes the directory's lock for the table and starts the file afresh (empty and
    sparse): a working file is never a checkpoint.

    Raises:
        DiskTableError: the directory cannot be created or written (read-only file system,
            permissions), or another engine holds it.
    """

    def __init__(
        self,
        table: str,
        directory: Path,
        layout: RecordLayout,
        rows: int,
        direct_io: bool | None,
        io_threads: int,
    ) -> None:
        self.table, self.directory, self.rows = table, directory, rows
        self.dtype = layout.dtype
        self.record_bytes = self.dtype.itemsize
        self.path = directory / f"{table}.rows"
        self.io_threads = io_threads
        self._fd = self._lock_fd = -1
        try:
            directory.mkdir(mode=0o700, parents=True, exist_ok=True)
            self._lock_fd = os.open(directory / f"{table}.lock", os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as e:
            raise self._error(e, "cannot create its lock file") from e
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            self.close()
            raise DiskTableError(
                errno.EBUSY,
                f"table '{table}': another engine is using its disk storage in {directory} "
                f"(the lock {directory / (table + '.lock')} is held); give each engine its own "
                "DiskStorage(directory=...), or close the other engine first",
            ) from e
        try:
            self._fd, self.direct = self._open(direct_io)
            os.ftruncate(self._fd, 0)  # the previous run's rows are not a checkpoint
            os.ftruncate(self._fd, rows * self.record_bytes)
        except OSError as e:
            self.close()
            raise self._error(e, f"cannot create its working file {self.path}") from e

    def _open(self, direct_io: bool | None) -> tuple[int, bool]:
        flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
        direct = getattr(os, "O_DIRECT", 0)
        if direct_io is not False and direct:
            try:
                return os.open(self.path, flags | direct, 0o600), True
            except OSError as e:
                if e.errno != errno.EINVAL or direct_io:
                    raise
        fd = os.open(self.path, flags, 0o600)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
        return fd, False

    def __del__(self) -> None:
        self.close()

    def close(self) -> None:
        """Close the file and release the lock (the file stays, with the rows written)."""
        for name in ("_fd", "_lock_fd"):
            fd = getattr(self, name, -1)
            if fd >= 0:
                os.close(fd)  # closing the lock file's descriptor releases the flock
                setattr(self, name, -1)

    def grow(self, rows: int) -> None:
        """Extend the file to ``rows`` records (sparse: the new records take no disk).

        Raises:
            DiskTableError: the file cannot be extended.
        """
        try:
            os.ftruncate(self._fd, rows * self.record_bytes)
        except OSError as e:
            raise self._error(e, f"cannot extend its working file {self.path}") from e
        self.rows = rows

    @property
    def disk_bytes(self) -> int:
        """Bytes the file takes on disk (its written blocks; a sparse file's holes are free)."""
        return os.fstat(self._fd).st_blocks * 512 if self._fd >= 0 else 0

    # ------------------------------------------------------------------ reading, writing
    def read(self, ids: np.ndarray, out: np.ndarray) -> None:
        """Read the records of ``ids: (N,) int64`` (ascending, unique) into ``out[:N]``
        (an :func:`aligned` array of :attr:`dtype`).

        Raises:
            DiskTableError: the file is shorter than it should be or cannot be read.
        """
        self._run(ids, out, write=False)

    def write(self, ids: np.ndarray, records: np.ndarray) -> None:
        """Write ``records[:N]`` (an :func:`aligned` array) to ``ids: (N,) int64`` (ascending,
        unique). On an error some records may be written: they must hold values the table
        already holds elsewhere (the cache keeps its rows until this returns).

        Raises:
            DiskTableError: the disk is full, or the file cannot be written.
        """
        self._run(ids, records, write=True)
        if not self.direct and ids.size:
            os.fdatasync(self._fd)  # dirty pages cannot be dropped: write them out first
            os.posix_fadvise(self._fd, 0, 0, os.POSIX_FADV_DONTNEED)

    def _run(self, ids: np.ndarray, buffer: np.ndarray, write: bool) -> None:
        if ids.size == 0:
            return
        # runs of consecutive ids: [start, stop) positions in ids
        breaks = np.flatnonzero(np.diff(ids) != 1) + 1
        starts = np.concatenate(([0], breaks))
        stops = np.concatenate((breaks, [ids.size]))
        raw = memoryview(buffer.view(np.uint8).reshape(-1))
        runs = list(zip(starts.tolist(), stops.tolist(), ids[starts].tolist(), strict=True))
        if len(runs) < _INLINE_RUNS or self.io_threads == 1:
            self._runs(runs, raw, write)
            return
        parts = min(self.io_threads, len(runs))
        futures = [
            _pool(self.io_threads).submit(self._runs, runs[i::parts], raw, write)
            for i in range(parts)
        ]
        errors = [f.exception() for f in futures]
        first = next((e for e in errors if e is not None), None)
        if first is not None:
            raise first

    def _runs(self, runs: list[tuple[int, int, int]], raw: memoryview, write: bool) -> None:
        size, fd = self.record_bytes, self._fd
        for start, stop, first in runs:
            view, offset = raw[start * size : stop * size], first * size
            try:
                done = os.pwritev(fd, [view], offset) if write else os.preadv(fd, [view], offset)
            except OSError as e:
                raise self._error(e, "cannot write its working file" if write else "") from e
            if done != len(view):
                raise self._truncated() if not write else self._error(OSError(errno.ENOSPC, ""))
            if not self.direct and not write:
                os.posix_fadvise(fd, offset, len(view), os.POSIX_FADV_DONTNEED)

    # ------------------------------------------------------------------ errors
    def _truncated(self) -> DiskTableError:
        have = os.fstat(self._fd).st_size
        return DiskTableError(
            errno.EIO,
            f"table '{self.table}': its working file {self.path} is {have} bytes, expected "
            f"{self.rows * self.record_bytes}: it was truncated or replaced outside embcore; "
            "the table's rows there are lost: restore the engine from a checkpoint",
        )

    def unreadable(self, ids: np.ndarray) -> DiskTableError:
        """The error for records that do not hold what was written there."""
        return DiskTableError(
            errno.EIO,
            f"table '{self.table}': its working file {self.path} does not hold the rows "
            f"written there (records of ids {ids[:5].tolist()} are damaged or were changed "
            "outside embcore); restore the engine from a checkpoint",
        )

    def _error(self, error: OSError, what: str = "") -> DiskTableError:
        where = f"table '{self.table}' (disk storage in {self.directory})"
        if error.errno == errno.ENOSPC:
            text = (
                f"{where}: the disk is full; free space there or give the table a directory "
                "on a larger disk (nothing was changed: the step can be repeated)"
            )
        elif error.errno == errno.EROFS:
            text = (
                f"{where}: {what or 'cannot write'}: the directory is on a read-only file "
                "system; give DiskStorage(directory=...) a writable local directory"
            )
        elif error.errno in (errno.EACCES, errno.EPERM):
            text = (
                f"{where}: {what or 'cannot access its files'}: permission denied; give "
                "DiskStorage(directory=...) a directory this process may write"
            )
        else:
            text = (
                f"{where}: {what or 'cannot read its working file'} ({error.strerror or error}); "
                "check the disk, then restore the engine from a checkpoint"
            )
        return DiskTableError(error.errno or errno.EIO, text)
