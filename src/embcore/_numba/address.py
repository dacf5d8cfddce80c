"""Zero-copy array views from raw addresses, inside Numba kernels.

One kernel call covers every table and feature of a step, whose tensors have different shapes.
Rather than rebuilding a Numba typed list of arrays each step, the Python side passes a small
``int64`` descriptor table of ``tensor.data_ptr()`` values and shapes (see :mod:`.layout`), and
the kernel turns each address back into an array with :func:`matrix` or :func:`vector`. The
caller keeps the tensors alive for the duration of the call and has checked dtype, device and
contiguity, so the views are exactly the tensors' memory.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic
from numba.np.numpy_support import carray

__all__ = [
    "claim",
    "f32_matrix",
    "f32_vector",
    "i32_vector",
    "i64_vector",
    "prefetch",
    "prefetch_l2",
    "prefetch_row",
    "store_fence",
    "stream_line",
]


@intrinsic
def _voidptr(typingctx, address):  # type: ignore[no-untyped-def]
    """An ``int64`` address as a ``void*`` (the inverse of ``tensor.data_ptr()``)."""
    if not isinstance(address, types.Integer):
        return None

    def codegen(context, builder, signature, args):  # type: ignore[no-untyped-def]
        return builder.inttoptr(args[0], cgutils.voidptr_t)

    return types.voidptr(address), codegen


def _prefetch_codegen(locality: int):  # type: ignore[no-untyped-def]
    """Code for ``llvm.prefetch`` (read, data cache) of the line at an ``int64`` address
    with ``locality`` 3 (every cache level) down to 0."""

    def codegen(context, builder, signature, args):  # type: ignore[no-untyped-def]
        i32 = ir.IntType(32)
        fnty = ir.FunctionType(ir.VoidType(), [cgutils.voidptr_t, i32, i32, i32])
        fn = cgutils.get_or_insert_function(builder.module, fnty, "llvm.prefetch.p0")
        address = builder.inttoptr(args[0], cgutils.voidptr_t)
        builder.call(fn, [address, i32(0), i32(locality), i32(1)])
        return context.get_dummy_value()

    return codegen


@intrinsic
def prefetch(typingctx, address):  # type: ignore[no-untyped-def]
    """Hint the CPU to bring the cache line at ``address`` closer (``llvm.prefetch``, read,
    high locality). Random row accesses are latency bound; prefetching a few rows ahead keeps
    several misses in flight."""
    if not isinstance(address, types.Integer):
        return None
    return types.void(address), _prefetch_codegen(3)


@intrinsic
def prefetch_l2(typingctx, address):  # type: ignore[no-untyped-def]
    """:func:`prefetch` into the second-level cache only (``llvm.prefetch`` locality 2,
    ``prefetcht1`` on x86): a prefetch far ahead that does not hold one of the few
    first-level miss buffers while it waits for memory."""
    if not isinstance(address, types.Integer):
        return None
    return types.void(address), _prefetch_codegen(2)


@intrinsic
def stream_line(typingctx, dst, src):  # type: ignore[no-untyped-def]
    """Copy the 64 bytes at ``src`` to ``dst`` (64-byte aligned) with a non-temporal store:
    the line is written without first being read into the cache (no read for ownership) and
    not kept there. For output that is written whole and read much later, e.g. the rows of
    a stacked activation, each on another page where the hardware prefetcher cannot follow.
    Such stores are weakly ordered: :func:`store_fence` after the last one."""
    if not isinstance(dst, types.Integer) or not isinstance(src, types.Integer):
        return None

    def codegen(context, builder, signature, args):  # type: ignore[no-untyped-def]
        line = ir.VectorType(ir.FloatType(), 16)
        value = builder.load(builder.inttoptr(args[1], line.as_pointer()), align=4)
        store = builder.store(value, builder.inttoptr(args[0], line.as_pointer()), align=64)
        store.set_metadata("nontemporal", builder.module.add_metadata([ir.IntType(32)(1)]))
        return context.get_dummy_value()

    return types.void(dst, src), codegen


@intrinsic
def store_fence(typingctx):  # type: ignore[no-untyped-def]
    """Order every earlier store, non-temporal ones included, before any later one (a full
    fence: ``mfence`` on x86), so that :func:`stream_line`'s rows are visible to the thread
    that reads them once the kernel returns."""

    def codegen(context, builder, signature, args):  # type: ignore[no-untyped-def]
        builder.fence("seq_cst")
        return context.get_dummy_value()

    return types.void(), codegen


@intrinsic
def _fetch_add(typingctx, address, value):  # type: ignore[no-untyped-def]
    """Atomically add ``value`` to the ``int64`` at ``address``; the value before."""
    if not isinstance(address, types.Integer) or not isinstance(value, types.Integer):
        return None

    def codegen(context, builder, signature, args):  # type: ignore[no-untyped-def]
        i64 = ir.IntType(64)
        pointer = builder.inttoptr(args[0], i64.as_pointer())
        amount = context.cast(builder, args[1], signature.args[1], types.int64)
        return builder.atomic_rmw("add", pointer, amount, "monotonic")

    return types.int64(address, value), codegen


@njit(cache=True, inline="always", error_model="numpy")
def claim(counter):  # type: ignore[no-untyped-def]
    """The next unit of work: ``counter[0]``, incremented atomically. Workers of one kernel
    call share a ``(1,) int64`` counter that starts at 0 and each takes units until they run
    out, so a worker the OS leaves waiting does not hold up the others (a fixed round-robin
    deal would leave its share undone until it runs)."""
    return _fetch_add(counter.ctypes.data, 1)


@njit(cache=True, error_model="numpy")
def prefetch_row(address, row, row_bytes):  # type: ignore[no-untyped-def]
    """Prefetch every cache line of row ``row`` of a matrix at ``address``."""
    start = address + row * row_bytes
    for offset in range(0, row_bytes, 64):
        prefetch(start + offset)


@njit(cache=True, error_model="numpy")
def f32_matrix(address, rows, cols):  # type: ignore[no-untyped-def]
    """The ``(rows, cols) float32`` C-contiguous array at ``address``."""
    return carray(_voidptr(address), (rows, cols), np.float32)


@njit(cache=True, error_model="numpy")
def f32_vector(address, size):  # type: ignore[no-untyped-def]
    """The ``(size,) float32`` array at ``address``."""
    return carray(_voidptr(address), (size,), np.float32)


@njit(cache=True, error_model="numpy")
def i64_vector(address, size):  # type: ignore[no-untyped-def]
    """The ``(size,) int64`` array at ``address``."""
    return carray(_voidptr(address), (size,), np.int64)


@njit(cache=True, error_model="numpy")
def i32_vector(address, size):  # type: ignore[no-untyped-def]
    """The ``(size,) int32`` array at ``address``."""
    return carray(_voidptr(address), (size,), np.int32)
