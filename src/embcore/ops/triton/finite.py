"""Which activation gradients hold a NaN or an Inf, decided on the device, read once.

The engine checks every gradient of a step before any table is written. Each float32
gradient is scanned by one launch (``BLOCK`` elements per program) that sets its tensor's flag
in one small device buffer when it finds a NaN or an Inf; other tensors (non-contiguous,
other dtypes) set theirs with a device-side PyTorch reduction. The host reads the whole buffer
once (:func:`non_finite`): one transfer per check, however many features. See
docs/gpu_backend.md.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import triton
import triton.language as tl
from torch import Tensor

from embcore.ops.triton import launch

__all__ = ["non_finite", "non_finite_flags"]

#: elements one program scans
BLOCK = 4096


@triton.jit(do_not_specialize=["index"])
def _non_finite_kernel(x, n, flags, index, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    v = tl.load(x + offs, mask=offs < n, other=0.0)
    bad = (v != v) | (tl.abs(v) == float("inf"))
    if tl.max(bad.to(tl.int32), axis=0) > 0:
        tl.store(flags + index, 1)  # several programs may write the same 1


def non_finite_flags(tensors: Sequence[Tensor]) -> Tensor:
    """``(len(tensors),) int32`` on the tensors' device: 1 where a tensor holds a NaN or an
    Inf. Nothing is read back to the host."""
    device = tensors[0].device if tensors else torch.device("cpu")
    flags = torch.zeros(len(tensors), dtype=torch.int32, device=device)
    for i, t in enumerate(tensors):
        if t.numel() == 0:
            continue
        if t.dtype == torch.float32 and t.is_contiguous() and t.device == device:
            n = t.numel()
            launch.run(
                _non_finite_kernel, triton.cdiv(n, BLOCK), x=t, n=n, flags=flags, index=i,
                BLOCK=BLOCK, num_warps=4,
            )  # fmt: skip
        else:
            flags[i] = (~torch.isfinite(t.to(device))).any()
    return flags


def non_finite(tensors: Sequence[Tensor]) -> list[bool]:
    """For each tensor, whether it holds a NaN or an Inf (one device-to-host read)."""
    return [bool(v) for v in non_finite_flags(tensors).tolist()]
