"""The one place the Triton backend launches a kernel, so every launch can be recorded.

Every kernel of the backend runs through :func:`run`. Inside :func:`recording`, ``run`` does
not launch: it records the kernel and its arguments (tensors, scalars, constexprs, launch
options) instead. ``embcore kernels`` (:mod:`.aot`) drives the backend's own ``lookup``,
``update`` and ``non_finite`` on small CPU tensors under :func:`recording` and compiles exactly
what was recorded, so the list of kernels and specialisations it checks is derived from the
code that launches them. See docs/gpu_backend.md.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

__all__ = ["Launch", "is_recording", "recording", "run"]


@dataclass(frozen=True)
class Launch:
    """One recorded launch: ``kernel[(programs,)](**kwargs)``."""

    kernel: Any
    programs: int
    kwargs: dict[str, Any]


_recorded: list[Launch] | None = None


def run(kernel: Any, programs: int, **kwargs: Any) -> None:
    """Launch ``kernel`` over ``programs`` programs (none when 0), or record the launch.

    Every kernel is compiled with ``enable_fp_fusion=False`` unless the caller says otherwise:
    products are rounded before they are added, as in PyTorch (and Triton 3.9 warns on a
    launch that leaves the choice to its changing default)."""
    kwargs.setdefault("enable_fp_fusion", False)
    if _recorded is not None:
        _recorded.append(Launch(kernel, programs, kwargs))
    elif programs > 0:
        kernel[(programs,)](**kwargs)


def is_recording() -> bool:
    """Whether launches are being recorded rather than run."""
    return _recorded is not None


@contextmanager
def recording() -> Iterator[list[Launch]]:
    """Record launches instead of running them; yields the list they are appended to."""
    global _recorded
    if _recorded is not None:
        raise RuntimeError("embcore.ops.triton.launch: recording() does not nest")
    _recorded = []
    try:
        yield _recorded
    finally:
        _recorded = None
