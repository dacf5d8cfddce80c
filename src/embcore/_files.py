"""Opening files that someone else may have written: regular files only, no symbolic link
followed, sizes known before reading, so that a crafted name or a link to ``/dev/zero`` or a
FIFO is refused at once instead of hanging or reading outside. See docs/reliability.md.
"""

from __future__ import annotations

import os
import stat

__all__ = ["UnsafeFileError", "open_regular", "read_regular"]


class UnsafeFileError(ValueError):
    """A path that is a symbolic link, a device, a FIFO or a directory where a regular file
    was expected, or a file too large to be what it claims."""


def open_regular(path: str | os.PathLike[str]) -> tuple[int, int]:
    """``(fd, size)`` of the regular file ``path``, opened read-only without following a
    final symbolic link (and without blocking on a FIFO). The caller closes ``fd``.

    Raises:
        UnsafeFileError: ``path`` is a link or not a regular file.
        FileNotFoundError: nothing there.
    """
    where = os.fspath(path)
    try:
        fd = os.open(where, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as error:
        if os.path.islink(where):
            raise UnsafeFileError(
                f"{where} is a symbolic link; only regular files are read here"
            ) from error
        raise
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        os.close(fd)
        raise UnsafeFileError(f"{where} is not a regular file")
    return fd, info.st_size


def read_regular(path: str | os.PathLike[str], limit: int = 1 << 30) -> bytes:
    """The whole of the regular file ``path`` (see :func:`open_regular`), at most ``limit``
    bytes (a larger file is refused)."""
    fd, size = open_regular(path)
    with os.fdopen(fd, "rb") as f:
        if size > limit:
            raise UnsafeFileError(f"{os.fspath(path)} is {size} bytes, more than {limit}")
        return f.read(size)
