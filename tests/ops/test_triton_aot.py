"""``embcore kernels``: every Triton kernel compiles ahead of time for sm_80 and sm_90, no GPU.

Runs the real command in this process; without CUDA, conftest sets ``TRITON_INTERPRET=1``, so
the command must (and does) re-run itself without the interpreter to compile anything. Every
``@triton.jit`` kernel defined in the backend's sources must appear in its rows: the list of
specialisations is recorded from the backend's own launches, so a new kernel is compiled as
soon as the backend launches it, and this test fails if one is never launched.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytest.importorskip("triton")

from embcore.cli.main import main

BACKEND = Path(__file__).resolve().parents[2] / "src" / "embcore" / "ops" / "triton"


def _defined_kernels() -> set[str]:
    """``module.kernel`` of every ``@triton.jit`` function named ``*_kernel`` in the sources."""
    found = set()
    for path in BACKEND.rglob("*.py"):
        module = ".".join(path.relative_to(BACKEND).with_suffix("").parts)
        source = path.read_text()
        for name in re.findall(r"@triton\.jit(?:\([^)]*\))?\ndef (_\w*kernel)\(", source):
            found.add(f"{module}.{name.strip('_')}")
    return found


@pytest.mark.slow
def test_every_kernel_compiles_for_sm_80_and_sm_90_without_spills(capsys) -> None:
    """The whole list, both architectures (about 2 minutes on 2 cores)."""
    assert main(["kernels", "--arch", "sm_80", "sm_90", "--jobs", "2"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    pattern = r"(\d+) kernels compiled for sm_80, sm_90: 0 failed, 0 spilling"
    last = re.fullmatch(pattern, lines[-1])
    assert last, lines[-1]
    rows = [ln.split() for ln in lines[2:-1]]
    assert len(rows) == int(last.group(1)) > 100
    names = {r[1] for r in rows}
    assert _defined_kernels() <= names, _defined_kernels() - names
    assert {"rules.adam.kernel", "forward.pooled_kernel", "backward.partials_kernel"} <= names
    assert {r[0] for r in rows} == {"sm_80", "sm_90"}
    for row in rows:
        regs, spill, warps = int(row[-5]), int(row[-4]), int(row[-2])
        assert 0 < regs <= 255 and spill == 0 and warps in (1, 2, 4, 8), row
    labels = " ".join(" ".join(r[2:-5]) for r in rows)
    for flag in ("f32", "f16", "bf16", " sr ", "dense", "lazy", "weighted", "mixed", "pow"):
        assert flag in labels, flag


def test_bad_architecture_is_a_clear_error(capsys) -> None:
    assert main(["kernels", "--arch", "hopper"]) == 2
    assert "--arch 'hopper': expected sm_<compute capability>" in capsys.readouterr().err
