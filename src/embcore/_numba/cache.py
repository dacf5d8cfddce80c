"""Where embcore's Numba kernels cache their compiled code on disk, keyed by their sources.

Numba's own cache (``@njit(cache=True)``) checks only the file that defines a kernel. Kernels
inline helpers from other files (this package's ``address.py`` and ``mix.py``, the CPU
backend's ``combine.py`` and ``rules/_rows.py``), so a changed helper would leave stale machine
code in place. Every kernel is therefore cached in a directory named after the embcore version
and a hash of the contents of every source file of this package (:func:`kernel_cache_dir`);
a package whose kernels inline these helpers nests its own directory in it, named after a hash
of its own sources (:func:`package_cache_dir`). Any change to any of them (an upgrade, a local
edit) selects a fresh directory. The directory sits under ``$NUMBA_CACHE_DIR/embcore`` when
that is set, else under the user's cache directory (``~/.cache/embcore/numba`` on Linux).
See docs/cpu_backend.md.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from numba.core import config
from numba.misc.appdirs import AppDirs

__all__ = [
    "SOURCE_ROOT",
    "cache_root",
    "kernel_cache_dir",
    "kernels_cached_in",
    "package_cache_dir",
    "source_key",
]

#: the directory whose ``.py`` files the cache key covers (this package, the shared helpers)
SOURCE_ROOT = Path(__file__).resolve().parent


def source_key(root: Path = SOURCE_ROOT) -> str:
    """16 hex digits of a SHA-256 over the relative path and bytes of every ``.py`` file under
    ``root``, in sorted order: equal for equal sources, different after any change."""
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        digest.update(path.relative_to(root).as_posix().encode() + b"\0")
        digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def cache_root() -> Path:
    """``$NUMBA_CACHE_DIR/embcore`` if the user chose a Numba cache directory, else the
    user's cache directory for embcore's kernels."""
    if config.CACHE_DIR:  # NUMBA_CACHE_DIR (or a .numba_config.yaml) as Numba read it
        return Path(config.CACHE_DIR) / "embcore"
    return Path(AppDirs("embcore", appauthor=False).user_cache_dir) / "numba"


def _version() -> str:
    embcore = sys.modules.get("embcore")
    return str(getattr(embcore, "__version__", "unknown"))


def _writable(path: Path) -> bool:
    try:
        path.mkdir(parents=True, exist_ok=True)
        tempfile.TemporaryFile(dir=path).close()
    except OSError:
        return False
    return True


def kernel_cache_dir() -> Path:
    """``<cache_root()>/<version>-<source_key()>``, or the same name under the system's
    temporary directory when the user's cache directory is not writable."""
    name = f"{_version()}-{source_key()}"
    preferred = cache_root() / name
    if _writable(preferred):
        return preferred
    user = os.getuid() if hasattr(os, "getuid") else os.environ.get("USERNAME", "")
    fallback = Path(tempfile.gettempdir()) / f"embcore-numba-{user}" / name
    return fallback if _writable(fallback) else preferred


def package_cache_dir(name: str, root: Path) -> Path:
    """``<kernel_cache_dir()>/<name>-<source_key(root)>``, created if possible: the directory
    of the kernels of the package at ``root``, which inline this package's helpers."""
    path = kernel_cache_dir() / f"{name}-{source_key(root)}"
    with contextlib.suppress(OSError):  # unwritable: Numba then compiles without caching
        path.mkdir(parents=True, exist_ok=True)
    return path


@contextmanager
def kernels_cached_in(path: Path) -> Iterator[None]:
    """Kernels decorated inside this block cache their code under ``path``.

    Numba picks a kernel's cache directory when the kernel is decorated, from
    ``numba.config.CACHE_DIR``; the setting is restored on exit, so other packages' Numba
    functions keep their own cache.
    """
    previous = config.CACHE_DIR
    config.CACHE_DIR = str(path)
    try:
        yield
    finally:
        config.CACHE_DIR = previous
