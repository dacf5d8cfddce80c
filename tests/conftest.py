"""Shared test set-up: every test starts from the same seeds; warnings are errors (pyproject).

Without CUDA, Triton's kernels run in its interpreter on CPU tensors (``TRITON_INTERPRET=1``,
read when triton is first imported, so set here before any test module imports it): the
``triton`` backend then joins every backend-parametrized conformance test
(``engine_cases.BACKENDS``) as well as its own (tests/ops/test_triton_interpreter.py).

The CPU kernels' on-disk compile cache is keyed by the contents of their sources
(``embcore._numba.cache``), so a session never runs kernels compiled from other sources and
needs no fresh cache directory of its own (docs/testing.md; NUMBA_CACHE_DIR is respected).
"""

from __future__ import annotations

import os
import random

import numpy as np
import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture(autouse=True)
def _seed() -> None:
    random.seed(0)
    np.random.seed(0)
    torch.manual_seed(0)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Without CUDA, ``gpu`` tests are skipped, except, when ``EMBCORE_TEST_DEVICE=cpu`` (the
    dry run of scripts/gpu_check.sh), those of modules that declare ``RUNS_IN_DRY_RUN``."""
    if torch.cuda.is_available():
        return
    dry_run = os.environ.get("EMBCORE_TEST_DEVICE") == "cpu"
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if item.get_closest_marker("gpu") is None:  # not "in keywords": a folder named gpu
            continue
        if dry_run and getattr(item.module, "RUNS_IN_DRY_RUN", False):
            continue
        item.add_marker(skip)


@pytest.fixture
def op_feature_checks(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The custom operators (``"lookup"``, ``"update"``) that ran their per-feature input
    checks, in order (tests of the known batches, :mod:`embcore.ops._known_batches`)."""
    from embcore.ops import _op_inputs

    ran: list[str] = []
    features = _op_inputs._features

    def counted(op: str, *args: object) -> None:
        ran.append(op)
        features(op, *args)

    monkeypatch.setattr(_op_inputs, "_features", counted)
    return ran
