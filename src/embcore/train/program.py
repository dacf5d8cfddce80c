"""The serving bundle's programs: the DLRM exported with ``torch.export`` (``model.pt2``) and,
optionally, compiled ahead of time by AOTInductor (``model.aoti.pt2``).

Both take ``(dense (B, 13) float32, sparse (B, 26) int64)`` preprocessed rows and return
``(B,) float32`` click logits, for any ``B``, with PyTorch alone: no embcore, no Numba. See
docs/main_job.md ("Serving without embcore") and docs/serving.md.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch import Tensor
from torch.export import Dim, ExportedProgram

from embcore.data.batch import NUM_DENSE, SPARSE_NAMES
from embcore.errors import UserError
from embcore.models import DLRM
from embcore.serving import compile_package, export, save_program

__all__ = ["FORMATS", "PROGRAM_FILES", "load_program", "write_programs"]

#: ``--format`` of ``embcore export`` / ``embcore predict`` -> the program file ("safetensors":
#: none, the model is rebuilt from the tensor files).
PROGRAM_FILES: dict[str, str] = {"pt2": "model.pt2", "aoti": "model.aoti.pt2"}
FORMATS: tuple[str, ...] = ("safetensors", *PROGRAM_FILES)

#: what the programs take and return, recorded in the bundle's manifest
SIGNATURE = {
    "inputs": {
        "dense": f"(B, {NUM_DENSE}) float32: log(1 + max(x, 0)) of the count features",
        "sparse": f"(B, {len(SPARSE_NAMES)}) int64: ids in [0, vocabulary_size) per column "
        "of sparse_features",
    },
    "output": "(B,) float32 click logits",
}


def write_programs(model: DLRM, out: Path, fmt: str) -> dict[str, float]:
    """Write the program files of ``fmt`` (``"pt2"``: ``model.pt2``; ``"aoti"``: both) into
    ``out``; return the seconds each step took (``export``, ``save``, ``aoti``)."""
    seconds: dict[str, float] = {}
    if fmt == "safetensors":
        return seconds
    start = time.perf_counter()
    dense = torch.zeros(2, NUM_DENSE, dtype=torch.float32)  # example rows; B stays symbolic
    sparse = torch.zeros(2, len(model.sparse_names), dtype=torch.int64)
    batch = Dim("batch", min=0)
    program = export(model, (dense, sparse), dynamic_shapes=({0: batch}, {0: batch}))
    seconds["export"] = time.perf_counter() - start
    start = time.perf_counter()
    save_program(program, out / PROGRAM_FILES["pt2"])  # a full disk: DiskFullError, no abort
    seconds["save"] = time.perf_counter() - start
    if fmt == "aoti":
        start = time.perf_counter()
        _compile(program, out / PROGRAM_FILES["aoti"])
        seconds["aoti"] = time.perf_counter() - start
    return seconds


def _compile(program: ExportedProgram, path: Path) -> None:
    """:func:`embcore.serving.compile_package`; a missing C++ compiler is the user's to fix."""
    from torch._inductor import config
    from torch._inductor.exc import InductorError

    try:
        compile_package(program, path)
    except InductorError as error:
        if "InvalidCxxCompiler" not in str(error):
            raise  # anything else is a bug (in PyTorch or embcore): keep the traceback
        raise UserError(
            f"--format aoti: AOTInductor found no working C++ compiler (tried "
            f"{config.cpp.cxx[-1]!r}); install g++ or set CXX, or export with --format pt2"
        ) from None


def load_program(path: Path, fmt: str) -> Callable[[Tensor, Tensor], Tensor]:
    """The program file ``path`` of ``fmt`` (``"pt2"`` or ``"aoti"``) as a function
    ``(dense, sparse) -> logits``."""
    if fmt == "aoti":
        from torch._inductor import aoti_load_package

        return aoti_load_package(str(path))
    return torch.export.load(path).module()
