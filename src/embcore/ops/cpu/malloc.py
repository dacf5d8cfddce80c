"""Let glibc's malloc keep freed memory for reuse instead of handing it back to the kernel.

A training step allocates a few batch-sized tensors (activations, their gradients: about 27 MB
each for W1) and frees them at the end. By default glibc serves such sizes with ``mmap`` and
returns them with ``munmap``, or trims them off the heap, so every step the kernel maps and
zeroes fresh pages again: about 5,000 page faults and 3-4 ms per W1 step on the benchmark
machine, for every system alike. :func:`keep_freed_memory` raises the mmap threshold and the
trim threshold (``mallopt``), so such blocks come from the heap and stay there: the next
step reuses pages that are already mapped. The price is that freed memory is not returned
to the kernel (resident memory stays at its high-water mark, which a training loop reaches
every step anyway).

It changes the whole process, so embcore never calls it on import: ``embcore train`` and
``embcore bench`` (for every system it runs) call it, and a training script may. The
environment variables ``MALLOC_MMAP_THRESHOLD_`` and ``MALLOC_TRIM_THRESHOLD_`` do the same
before a process starts; jemalloc or tcmalloc via ``LD_PRELOAD`` are alternatives.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys

__all__ = ["keep_freed_memory"]

_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
#: glibc refuses mmap thresholds above 32 MiB on 64-bit machines
MAX_MMAP_THRESHOLD = 32 << 20


def keep_freed_memory(
    mmap_threshold: int = MAX_MMAP_THRESHOLD, trim_threshold: int = 1 << 30
) -> bool:
    """Serve blocks below ``mmap_threshold`` bytes from the heap and trim it only when more
    than ``trim_threshold`` bytes are free at its top. Returns whether glibc took both
    settings (``False`` elsewhere, e.g. on macOS or with another allocator preloaded)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    mmap_ok = mallopt(_M_MMAP_THRESHOLD, min(int(mmap_threshold), MAX_MMAP_THRESHOLD)) == 1
    trim_ok = mallopt(_M_TRIM_THRESHOLD, int(trim_threshold)) == 1
    return mmap_ok and trim_ok
