"""Every backend declares the whole ``ops.Backend`` contract, checked when it is resolved."""

from __future__ import annotations

import ast
import importlib.util
import sys
import types
from pathlib import Path

import pytest
import torch

from embcore import ops
from embcore.ops import _backend

# Importing the Triton backend decorates its kernels, which must happen after the interpreter
# tests set TRITON_INTERPRET: its module is read, not imported, here.
IMPORTED = [name for name in ops.BACKENDS if name != "triton"]


@pytest.mark.parametrize("name", IMPORTED)
def test_each_backend_declares_the_contract(name):
    backend = ops.resolve(name)
    assert name == backend.NAME
    assert torch.float32 in backend.STORAGE_DTYPES
    assert isinstance(backend.LOOKUP_WRITES_OUT, bool)
    assert all(callable(f) for f in (backend.lookup, backend.update, backend.non_finite))
    assert ops.resolve(name) is backend  # resolved once


@pytest.mark.parametrize("name", ops.BACKENDS)
def test_each_backend_module_defines_every_member(name):
    path = importlib.util.find_spec(ops.BACKENDS[name]).origin
    tree = ast.parse(Path(path).read_text())
    defined = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            defined.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            defined |= {t.id for t in targets if isinstance(t, ast.Name)}
        elif isinstance(node, ast.ImportFrom):  # a member may come from a submodule
            defined |= {a.asname or a.name for a in node.names}
    members = {"NAME", "STORAGE_DTYPES", "LOOKUP_WRITES_OUT", "lookup", "update", "non_finite"}
    assert members <= defined, sorted(members - defined)


def test_a_backend_missing_a_member_is_refused(monkeypatch):
    module = types.ModuleType("embcore_test_incomplete_backend")
    module.NAME = "incomplete"
    module.STORAGE_DTYPES = (torch.float32,)
    module.lookup = lambda states, features: []
    monkeypatch.setitem(sys.modules, module.__name__, module)
    monkeypatch.setitem(_backend.BACKENDS, "incomplete", module.__name__)
    with pytest.raises(TypeError, match=r"'incomplete' does not define .*LOOKUP_WRITES_OUT"):
        ops.resolve("incomplete")


def test_an_unknown_backend_names_the_available_ones():
    with pytest.raises(NotImplementedError, match=r"unknown backend 'nope'; available: \["):
        ops.resolve("nope")
