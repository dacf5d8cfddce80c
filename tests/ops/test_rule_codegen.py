"""The compiled per-row loops of the CPU optimizer kernels do no reference counting.

Each rule's per-row loop (``_rows``, and non-lazy Adam's ``_rows_all`` in
:mod:`embcore.ops.cpu.rules`) is its own kernel, called per table or chunk of rows. Numba
counts references to a view of an owned array around every inlined helper call: a locked
increment and decrement per row, each a full fence that serialises the row stores (about a
third of row-wise Adagrad's update time). These tests compile every loop afresh for the
argument types a real step gives it and fail if ``NRT_incref`` or ``NRT_decref`` is called
anywhere in the loop's native code (the Python wrapper Numba adds around it is left out: it
unboxes the arguments and never runs in a step).
"""

from __future__ import annotations

import re

import numba
import pytest
import torch
from optimizer_cases import OPTIMIZERS

import embcore as ec
from embcore.inputs import FeatureBatch
from embcore.ops import cpu
from embcore.ops.cpu.rules import RULES
from embcore.ops.state import TableState

LOOPS = ("_rows", "_rows_all")
KERNELS = ("update", "update_all", "fused", "update_listed")
_DEFINE = re.compile(r"^define [^@]*@(\S+?)\(", re.M)


def _fresh(kernel):  # type: ignore[no-untyped-def]
    """The kernel compiled again from its source, without the on-disk cache (whose code
    carries no LLVM IR to inspect)."""
    options = {k: v for k, v in kernel.targetoptions.items() if k not in ("cache", "nopython")}
    return numba.njit(**options)(kernel.py_func)


def native_bodies(ir: str) -> dict[str, str]:
    """Each native function defined in a module's LLVM IR -> its body (Numba's CPython
    and C wrappers left out)."""
    starts = [(m.start(), m.group(1)) for m in _DEFINE.finditer(ir)]
    bodies = {}
    for (start, name), (stop, _) in zip(starts, [*starts[1:], (len(ir), "")], strict=True):
        if name.startswith("_ZN") and not name.startswith("_ZN7cpython"):
            bodies[name] = ir[start:stop]
    return bodies


def refcount_calls(kernel) -> dict[str, int]:  # type: ignore[no-untyped-def]
    """For each signature the kernel was compiled for, how many ``NRT_incref``/``NRT_decref``
    calls its native code makes."""
    fresh, found = _fresh(kernel), {}
    for sig in kernel.signatures:
        fresh.compile(sig)
        bodies = native_bodies(fresh.inspect_llvm(sig))
        assert bodies, f"{kernel.__name__}: no native function found in its LLVM IR"
        text = "".join(bodies.values())
        found[str(sig)] = len(re.findall(r"call void @NRT_(?:incref|decref)\(", text))
    return found


def _state(optimizer: ec.Optimizer, seed: int) -> TableState:
    gen = torch.Generator().manual_seed(seed)
    slots = {s.name: torch.full(s.shape(30, 8), 0.5) for s in optimizer.slot_specs()}
    return TableState(f"t{seed}", torch.randn(30, 8, generator=gen), slots, optimizer)


def _batch() -> FeatureBatch:
    values = torch.tensor([3, 7, 3, 11, 29, 0])
    return FeatureBatch(values, torch.tensor([0, 2, 3, 6]), None, "sum", (3,))


@pytest.fixture(scope="module")
def compiled_loops() -> dict[str, dict[str, int]]:
    """Run one step of every optimizer case, alone (the fused path where there is one) and
    beside an SGD table (the per-rule path), then compile every kernel afresh for the types
    it met, which types (and so records) the loops it calls."""
    torch.set_num_threads(1)
    for i, optimizer in enumerate(OPTIMIZERS.values()):
        alone = _state(optimizer, i)
        cpu.update([alone], [[_batch()]], [[torch.ones(3, 8)]], [0.1], 1)
        pair = [_state(optimizer, i), _state(ec.SGD(learning_rate=0.1), i)]
        cpu.update(pair, [[_batch()], [_batch()]], [[torch.ones(3, 8)]] * 2, [0.1, 0.1], 1)
    for module in RULES.values():
        for name in KERNELS:
            if (kernel := getattr(module, name, None)) is not None:
                for sig in kernel.signatures:
                    _fresh(kernel).compile(sig)
    return {
        f"{module.__name__.rsplit('.', 1)[1]}.{name}": refcount_calls(getattr(module, name))
        for module in RULES.values()
        for name in LOOPS
        if hasattr(module, name)
    }


@pytest.mark.slow
def test_every_rule_has_a_compiled_row_loop(compiled_loops: dict[str, dict[str, int]]) -> None:
    rules = {name.split(".")[0] for name, sigs in compiled_loops.items() if sigs}
    assert rules == {m.__name__.rsplit(".", 1)[1] for m in RULES.values()}
    assert compiled_loops["adam._rows_all"], "non-lazy Adam's loop was never compiled"


@pytest.mark.slow
def test_row_loops_do_no_reference_counting(compiled_loops: dict[str, dict[str, int]]) -> None:
    counted = {name: calls for name, sigs in compiled_loops.items() for calls in sigs.values()}
    assert counted
    assert {name: calls for name, calls in counted.items() if calls} == {}
