"""The Numba kernels' on-disk cache can never serve code compiled from other sources.

Numba keys its cache by the file that defines a kernel only; embcore caches every kernel in a
directory named after a hash of the shared helpers' sources (embcore._numba.cache), the CPU
backend's and the dynamic tables' kernels in subdirectories named after a hash of their own
package's sources, so a change to a helper that kernels inline (``_numba/address.py``,
``combine.py``, ``rules/_rows.py``) selects a fresh directory. These tests check the key, that
every kernel uses the directory, and, end to end in fresh processes, that a changed helper is
compiled anew.
"""

from __future__ import annotations

import ast
import importlib
import os
import pkgutil
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import embcore
import embcore._numba
import embcore.ops.cpu
from embcore._numba import cache as _cache

SRC = Path(embcore.__file__).resolve().parent
CPU = SRC / "ops" / "cpu"


def _copy_sources(source: Path, target: Path) -> Path:
    shutil.copytree(source, target, ignore=shutil.ignore_patterns("__pycache__"))
    return target


def _edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert text.count(old) == 1, f"{path.name} no longer holds {old!r}"
    path.write_text(text.replace(old, new))


# ------------------------------------------------------------------------------ the key


@pytest.mark.parametrize(
    ("root", "helper"),
    [
        (CPU, "combine.py"),
        (_cache.SOURCE_ROOT, "address.py"),
        (_cache.SOURCE_ROOT, "mix.py"),
        (CPU, "rules/_rows.py"),
        (CPU, "layout.py"),
    ],
)
def test_the_key_changes_when_any_helper_changes(tmp_path: Path, root: Path, helper: str) -> None:
    copy = _copy_sources(root, tmp_path / "cpu")
    assert _cache.source_key(copy) == _cache.source_key(root)
    original = (copy / helper).read_text()
    (copy / helper).write_text(original + "# one more line\n")
    changed = _cache.source_key(copy)
    assert changed != _cache.source_key(root)
    (copy / helper).write_text(original)
    assert _cache.source_key(copy) == _cache.source_key(root)


def test_the_key_covers_new_and_moved_files_but_not_other_kinds(tmp_path: Path) -> None:
    copy = _copy_sources(CPU, tmp_path / "cpu")
    key = _cache.source_key(copy)
    (copy / "notes.txt").write_text("not a source")
    assert _cache.source_key(copy) == key
    (copy / "rules" / "extra.py").write_text("X = 1\n")
    assert _cache.source_key(copy) not in (key, _cache.source_key(CPU))
    (copy / "rules" / "extra.py").rename(copy / "extra.py")  # same bytes, another module
    moved = _cache.source_key(copy)
    assert moved != key
    (copy / "extra.py").unlink()
    assert _cache.source_key(copy) == key


def test_the_directory_is_named_after_the_version_and_the_key() -> None:
    path = _cache.kernel_cache_dir()
    assert path.name == f"{embcore.__version__}-{_cache.source_key()}"
    assert path.is_dir()
    cpu = _cache.package_cache_dir("cpu", CPU)
    assert cpu == path / f"cpu-{_cache.source_key(CPU)}" and cpu.is_dir()


# ------------------------------------------------------------------- the kernels use it


def _kernels() -> list[tuple[str, object]]:
    """Every Numba dispatcher defined in a module of embcore._numba, embcore.ops.cpu or
    embcore.dynamic."""
    found = []
    for package in (embcore._numba, embcore.ops.cpu, importlib.import_module("embcore.dynamic")):
        for info in pkgutil.walk_packages(package.__path__, f"{package.__name__}."):
            module = importlib.import_module(info.name)
            for name, value in vars(module).items():
                py_func = getattr(value, "py_func", None)
                if py_func is not None and py_func.__module__ == module.__name__:
                    found.append((f"{module.__name__}.{name}", value))
    return found


def test_every_kernel_caches_in_the_keyed_directory() -> None:
    kernels = _kernels()
    assert len(kernels) > 20  # gather, dedup, finite, every rule and their helpers
    where = str(_cache.kernel_cache_dir())
    for name, kernel in kernels:
        path = kernel._cache.cache_path  # type: ignore[attr-defined]
        assert path is not None and path.startswith(where + os.sep), (name, path)


#: the packages whose kernels cache under a directory keyed by their sources (and the shared
#: helpers', which they inline): the helpers themselves, ops/cpu and the dynamic tables' index
KEYED_PACKAGES = (_cache.SOURCE_ROOT, CPU, SRC / "dynamic")


def test_numba_is_used_only_inside_the_keyed_packages() -> None:
    """Kernels anywhere else would inline helpers the key does not cover."""
    outside = []
    for path in SRC.rglob("*.py"):
        if any(path.is_relative_to(root) for root in KEYED_PACKAGES):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            if any(n == "numba" or n.startswith("numba.") for n in names):
                outside.append(str(path.relative_to(SRC)))
    assert outside == []


# ------------------------------------------------------------------- in fresh processes

_PROBE = textwrap.dedent(
    """
    import json
    import numpy as np
    import torch
    from numba.core import config
    from embcore.ops.cpu import finite

    # [1.0, inf]: a (1, 1) tensor over the first element only
    x = torch.tensor([1.0, float("inf")])
    table = np.array([[x.data_ptr(), 1, 1, 1]], dtype=np.int64)
    flags = np.zeros(1, dtype=np.int64)
    finite.non_finite_flags(table, flags, 0, 1)
    kernel = finite.non_finite_flags
    print(json.dumps({
        "flag": int(flags[0]),
        "cache_path": kernel._cache.cache_path,
        "cache_hits": sum(kernel.stats.cache_hits.values()),
        "numba_cache_dir": config.CACHE_DIR,
    }))
    """
)


def _probe(src: Path, numba_cache: Path) -> dict:
    import json

    env = {**os.environ, "PYTHONPATH": str(src), "NUMBA_CACHE_DIR": str(numba_cache)}
    done = subprocess.run(
        [sys.executable, "-c", _PROBE], env=env, capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_a_changed_helper_is_compiled_anew_not_loaded_from_the_cache(tmp_path: Path) -> None:
    """``finite.non_finite_flags`` inlines ``address.f32_vector``. A copy of embcore runs the
    kernel twice (compiled, then loaded from the cache); then ``f32_vector`` is changed to
    read one float further on, and the next process must see the new behaviour."""
    src = tmp_path / "src"
    package = _copy_sources(SRC, src / "embcore")
    numba_cache = tmp_path / "numba-cache"
    first = _probe(src, numba_cache)
    assert first["flag"] == 0 and first["cache_hits"] == 0
    # An explicit NUMBA_CACHE_DIR is respected (embcore nests its keyed directory in it) and
    # restored for other packages once the kernels are decorated.
    assert first["numba_cache_dir"] == str(numba_cache)
    assert Path(first["cache_path"]).is_relative_to(numba_cache / "embcore")
    second = _probe(src, numba_cache)
    assert second == {**first, "cache_hits": 1}  # the cache is used when nothing changed
    _edit(
        package / "_numba" / "address.py",
        "return carray(_voidptr(address), (size,), np.float32)",
        "return carray(_voidptr(address + 4), (size,), np.float32)",
    )
    third = _probe(src, numba_cache)
    assert third["flag"] == 1, "a stale kernel was loaded after its helper changed"
    assert third["cache_hits"] == 0 and third["cache_path"] != first["cache_path"]
