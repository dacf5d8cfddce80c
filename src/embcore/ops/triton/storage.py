"""Table storage dtypes of the Triton backend: float32, or float16 / bfloat16 with float32 math.

Half-precision tables halve the bytes a lookup and an update move. Rows are widened to float32
on load; the optimizer runs in float32 (its slots are always float32); the new row is narrowed
once when it is stored:

* round to nearest even (the default), exactly what ``tensor.to(dtype)`` does, so the result
  equals the reference backend's float32 update followed by ``.to(dtype)``;
* stochastic rounding (a table option: ``EmbeddingEngine(..., stochastic_rounding=True)``,
  carried to the kernels as ``TableState.stochastic_rounding``), which rounds up with probability
  equal to the distance to the lower neighbour over the gap, so that small updates that round
  to nearest would erase survive on average. It is unbiased: ``E[round(x)] = x``. The random
  bits come from Philox keyed by ``(seed, element offset)``; the seed is derived from the
  table and the step, so a run is reproducible.

How a stochastic round works on the float32 bit pattern (sign-magnitude, so adding to the
magnitude rounds away from zero)::

    bfloat16: keep the top 16 bits of  bits(x) + (r >> 16)          r: uniform uint32
    float16:  keep all but 13 low bits of bits(x) + (r >> 19)       |x| >= 2**-14 (normal)
              floor(x * 2**24 + u) * 2**-24,  u uniform in [0, 1)  |x| <  2**-14 (subnormal)
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

__all__ = [
    "STORAGE_CODES",
    "load_row",
    "store_row",
]

#: storage dtype -> the constexpr code the kernels branch on
STORAGE_CODES: dict[torch.dtype, int] = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}


@triton.jit
def load_row(ptr, offs, mask):
    """Load table elements at ``offs`` (any storage dtype) as float32; 0 where masked."""
    return tl.load(ptr + offs, mask=mask, other=0.0).to(tl.float32)


@triton.jit
def _stochastic_round(x, seed, offs, STORAGE: tl.constexpr):
    """``x`` float32 -> a float32 holding a value exactly representable in the storage dtype,
    rounded stochastically (module docstring)."""
    r = tl.randint(seed, offs)
    bits = x.to(tl.uint32, bitcast=True)
    if STORAGE == 2:  # bfloat16: the top 16 bits of a float32
        y = ((bits + (r >> 16)) & 0xFFFF0000).to(tl.float32, bitcast=True)
    else:  # float16: 10 mantissa bits, a fixed 2**-24 step below 2**-14
        normal = ((bits + (r >> 19)) & 0xFFFFE000).to(tl.float32, bitcast=True)
        u = (r >> 8).to(tl.float32) * 5.9604644775390625e-08  # uniform in [0, 1)
        tiny = tl.floor(x * 16777216.0 + u) * 5.9604644775390625e-08
        y = tl.where(tl.abs(x) < 6.103515625e-05, tiny, normal)
    return y


@triton.jit
def _nearest_bfloat16(x):
    """``x`` float32 rounded to nearest even bfloat16, as a float32. Done on the bits because
    Triton's interpreter truncates float32 -> bfloat16 conversions (the GPU rounds)."""
    bits = x.to(tl.uint32, bitcast=True)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000).to(tl.float32, bitcast=True)
    return tl.where(x != x, x, rounded)  # keep NaN a NaN


@triton.jit
def store_row(ptr, offs, mask, x, seed, STORAGE: tl.constexpr, STOCHASTIC: tl.constexpr):
    """Store float32 ``x`` at ``offs`` in the table's storage dtype (code ``STORAGE`` of
    :data:`STORAGE_CODES`), rounding to nearest even or, with ``STOCHASTIC``, stochastically."""
    if STORAGE == 0:
        tl.store(ptr + offs, x, mask=mask)
    elif STOCHASTIC:
        y = _stochastic_round(x, seed, offs, STORAGE)
        tl.store(ptr + offs, y.to(ptr.dtype.element_ty), mask=mask)
    elif STORAGE == 2:
        tl.store(ptr + offs, _nearest_bfloat16(x).to(ptr.dtype.element_ty), mask=mask)
    else:
        tl.store(ptr + offs, x.to(ptr.dtype.element_ty), mask=mask)
