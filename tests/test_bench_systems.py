"""``embcore bench``'s embcore rows: the prepared-input row steps on batches converted before
the clock and trains exactly as the row that converts raw batches in the step (tiny sizes, no
timing assertions)."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from sidebyside.systems import SYSTEMS, embcore_engine, embcore_prepared
from sidebyside.workloads import WORKLOADS, make_batches

import embcore as ec

TINY = dataclasses.replace(WORKLOADS["W1-quick"], vocab=(300, 40, 7), batch=16)


@pytest.mark.parametrize("optimizer", ["adagrad", "rowwise_adagrad"])
def test_prepared_row_trains_as_the_raw_row(optimizer: str) -> None:
    batches = make_batches(TINY, 3, seed=5)
    runs = {}
    for system in (embcore_engine, embcore_prepared):
        torch.manual_seed(0)  # the same initial tables
        runs[system.NAME] = run = system.build(TINY, optimizer, batches)
        for i in range(len(batches)):
            run.step(i)
    raw, prepared = runs[embcore_engine.NAME], runs[embcore_prepared.NAME]
    assert all(isinstance(x, ec.PreparedBatch) for x in prepared.inputs)
    assert not any(isinstance(x, ec.PreparedBatch) for x in raw.inputs)
    for name, table in raw.engine.embedding_tables.items():
        torch.testing.assert_close(prepared.engine.embedding_tables[name], table)
    assert raw.engine.step == prepared.engine.step == len(batches)


def test_prepared_row_is_listed_right_after_embcore() -> None:
    assert SYSTEMS.index(embcore_prepared) == SYSTEMS.index(embcore_engine) + 1
    assert embcore_prepared.NAME == "embcore, inputs prepared ahead"
