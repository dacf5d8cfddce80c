"""Atomic publication of files and directories: write elsewhere, flush, rename into place.

A reader (or a process restarted after a crash) sees either the previous content or the
complete new one, never a torn file. Every writer of embcore goes through these helpers; see
docs/reliability.md.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import shutil
import stat
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

__all__ = [
    "DiskFullError",
    "TempDir",
    "check_replaceable",
    "fsync_dir",
    "publish_dir",
    "remove_stale",
    "replace_dir",
    "temp_dir",
    "write_atomic",
    "writing",
]


class DiskFullError(OSError):
    """No space (or quota) left while writing; the message names the path."""


def fsync_dir(directory: str | os.PathLike[str]) -> None:
    """Flush a directory's entries (a rename inside it) to disk."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:  # pragma: no cover - platforms without directory fds
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


#: errno -> (what happened, what to do), for :class:`DiskFullError` messages
_FULL = {
    errno.ENOSPC: ("no space left on the device", "free some disk space or write elsewhere"),
    errno.EDQUOT: ("the disk quota is used up", "free some space or write elsewhere"),
    errno.EFBIG: (
        "a file grew past this process's file-size limit (ulimit -f)",
        "raise the limit or write elsewhere",
    ),
}
#: how the writers that do not raise ``OSError`` say it: Rust's I/O errors (safetensors) and
#: DCP's wrapped messages carry the OS's words
_FULL_TEXT = {
    "os error 28": errno.ENOSPC,
    "no space left on device": errno.ENOSPC,
    "os error 122": errno.EDQUOT,
    "disk quota exceeded": errno.EDQUOT,
    "os error 27": errno.EFBIG,
    "file too large": errno.EFBIG,
}


def _full(error: BaseException, path: str) -> int | None:
    """The errno of a full disk (or file-size limit) that ``error`` reports, else ``None``."""
    if isinstance(error, OSError) and error.errno in _FULL:
        return error.errno
    text = str(error).lower()
    for words, code in _FULL_TEXT.items():
        if words in text:
            return code
    # PyTorch's zip writer (torch.save to a path, torch.export.save) checks each write only by
    # the file position it reaches: "[enforce fail at inline_container.cc:...] unexpected pos"
    # (or "failed writing"), without the OS's errno. Ask the file system what ran out.
    if "inline_container.cc" in text and ("unexpected pos" in text or "failed writing" in text):
        return _what_ran_out(path)
    return None


def _what_ran_out(path: str) -> int | None:
    """ENOSPC when the file system of ``path`` is (nearly) full, EFBIG when a file-size limit
    is set, else ``None`` (another failure: its own message stays)."""
    import resource

    directory = os.path.dirname(os.path.abspath(path))
    while directory and not os.path.isdir(directory):
        directory = os.path.dirname(directory)
    try:
        fs = os.statvfs(directory or "/")
        if fs.f_bavail * fs.f_frsize < max(1 << 20, fs.f_blocks * fs.f_frsize // 100):
            return errno.ENOSPC
    except OSError:
        pass
    if resource.getrlimit(resource.RLIMIT_FSIZE)[0] != resource.RLIM_INFINITY:
        return errno.EFBIG
    return None


@contextmanager
def writing(path: str | os.PathLike[str]) -> Iterator[None]:
    """Turn a full disk (or quota, or file-size limit) into a :class:`DiskFullError` naming
    ``path``, whichever writer reported it: an ``OSError`` with its errno, PyTorch's zip
    writer ("unexpected pos"), safetensors' or DCP's wrapped I/O errors."""
    try:
        yield
    except DiskFullError:
        raise
    except Exception as error:
        code = _full(error, os.fspath(path))
        if code is None:
            raise
        what, fix = _FULL[code]
        detail = str(error).strip().splitlines()[0][:200] if str(error).strip() else ""
        raise DiskFullError(
            code,
            f"{what} while writing {os.fspath(path)} ({fix}; nothing was published): "
            f"{os.strerror(code)}" + (f" [{detail}]" if detail else ""),
        ) from error


def write_atomic(
    path: str | os.PathLike[str], data: bytes | Callable[[BinaryIO], None], mode: int = 0o644
) -> Path:
    """Write ``data`` (bytes, or a callback writing to a binary file) to ``path`` atomically:
    into a unique temporary file beside it, fsynced, renamed over ``path``.

    Raises:
        DiskFullError: the disk filled up (the temporary file is removed).
        FileExistsError: ``path`` exists and is not a regular file (a symbolic link, a
            directory, a FIFO, a device: ``--output /dev/null`` run as root would otherwise
            replace the device with a file); nothing is written.
    """
    path = Path(path)
    _check_regular(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with writing(path):
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as f:
                if callable(data):
                    data(f)
                else:
                    f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.chmod(tmp, mode)
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
    fsync_dir(path.parent)
    return path


_KINDS = (
    (stat.S_ISLNK, "a symbolic link"),
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def _check_regular(path: Path) -> None:
    """Refuse to replace anything but a regular file (or nothing) at ``path``."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    for test, kind in _KINDS:
        if test(mode):
            raise FileExistsError(
                errno.EEXIST,
                f"{path} exists and is {kind}, not a regular file; refusing to replace it "
                "(write to a file name)",
            )


class TempDir:
    """A directory being written for ``target``: ``<target>.tmp-<random>`` beside it, locked
    (``flock``) by the process that created it, so :func:`remove_stale` can tell a dead
    writer's leftover from a live writer's work."""

    def __init__(self, target: Path) -> None:
        self.target = target
        for _ in range(100):  # a retry only when a cleaner removed the new directory first
            path = tempfile.mkdtemp(dir=target.parent, prefix=f"{target.name}.tmp-")
            try:
                fd = os.open(path, os.O_RDONLY)
            except FileNotFoundError:  # removed as stale before we locked it: try again
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                if os.path.samestat(os.fstat(fd), os.stat(path)):
                    break
            except OSError:
                pass
            os.close(fd)
        else:
            raise OSError(errno.EAGAIN, f"could not create a temporary directory for {target}")
        os.chmod(path, 0o755)  # mkdtemp's is private; what it becomes is shared like any output
        self.path = Path(path)
        self._fd: int | None = fd

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def remove(self) -> None:
        """Delete the directory (a failed or abandoned write)."""
        shutil.rmtree(self.path, ignore_errors=True)
        self.release()


def remove_stale(target: str | os.PathLike[str]) -> list[Path]:
    """Delete what killed writers of ``target`` left (``<target>.tmp`` and unlocked
    ``<target>.tmp-*`` directories); a live writer's directory is left alone."""
    target = Path(target)
    removed = []
    if not target.parent.is_dir():
        return removed
    for p in target.parent.iterdir():
        if not (p.name == f"{target.name}.tmp" or p.name.startswith(f"{target.name}.tmp-")):
            continue
        if p.is_symlink() or not p.is_dir():
            continue
        try:
            fd = os.open(p, os.O_RDONLY)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:  # a live writer holds it
            os.close(fd)
            continue
        shutil.rmtree(p, ignore_errors=True)
        os.close(fd)
        removed.append(p)
    return removed


@contextmanager
def temp_dir(target: str | os.PathLike[str]) -> Iterator[TempDir]:
    """A fresh :class:`TempDir` for ``target``, removed if the block raises."""
    target = Path(os.path.abspath(target))
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = TempDir(target)
    try:
        with writing(target):
            yield tmp
    except BaseException:
        tmp.remove()
        raise
    tmp.release()


def publish_dir(tmp: str | os.PathLike[str], path: str | os.PathLike[str]) -> None:
    """Rename the complete directory ``tmp`` to ``path``: the commit point.

    An empty directory at ``path`` is replaced; anything else is never overwritten.

    Raises:
        FileExistsError: ``path`` exists and is not an empty directory (for instance another
            writer published it first); ``tmp`` is left for the caller to remove.
    """
    fsync_dir(tmp)
    try:
        os.rename(tmp, path)  # atomic; fails on a file, a link or a non-empty directory
    except OSError as error:
        if error.errno in (errno.EEXIST, errno.ENOTEMPTY, errno.ENOTDIR, errno.EISDIR):
            raise FileExistsError(
                error.errno,
                f"{os.fspath(path)} already exists (another writer may have published it "
                "first); it is never overwritten",
            ) from error
        raise
    fsync_dir(os.path.dirname(os.path.abspath(path)))


def check_replaceable(path: str | os.PathLike[str], marker: str) -> None:
    """Refuse to replace ``path`` unless it is absent, an empty directory, or a directory
    holding ``marker`` (one that the same writer made): never delete a user's other files."""
    path = Path(path)
    if path.is_symlink() or (path.exists() and not path.is_dir()):
        raise FileExistsError(
            errno.EEXIST, f"{path} exists and is not a directory; refusing to replace it"
        )
    if path.is_dir() and not (path / marker).is_file() and any(path.iterdir()):
        raise FileExistsError(
            errno.EEXIST,
            f"{path} is a non-empty directory without {marker}: not written by embcore; "
            "refusing to replace it (write to a new or empty directory)",
        )


def replace_dir(tmp: str | os.PathLike[str], path: str | os.PathLike[str], marker: str) -> None:
    """Publish ``tmp`` as ``path``, replacing a previous directory there (see
    :func:`check_replaceable`): the old one is first renamed aside (``<path>.old-*``), then
    deleted. A crash in between leaves no ``path`` but the old directory intact beside it,
    never a mix of both."""
    path = Path(os.path.abspath(path))
    check_replaceable(path, marker)
    if not path.exists():
        publish_dir(tmp, path)
        return
    old = Path(tempfile.mkdtemp(dir=path.parent, prefix=f"{path.name}.old-"))
    try:
        os.rename(path, old / path.name)
    except BaseException:
        old.rmdir()
        raise
    try:
        publish_dir(tmp, path)
    except BaseException:  # another writer published meanwhile: put the old one back if we can
        with contextlib.suppress(OSError):
            os.rename(old / path.name, path)
            old.rmdir()
        raise
    shutil.rmtree(old, ignore_errors=True)
