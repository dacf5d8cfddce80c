"""``train.pipeline`` reaches the engine: the main job can run pipelined
(docs/semantics.md §4.5)."""

from __future__ import annotations

import pytest
import torch

from embcore.train.config import Config
from embcore.train.loop import train


def test_pipeline_option_reaches_the_engine_and_changes_only_staleness(tiny: Config) -> None:
    plain = train(
        tiny.with_overrides(["train.out_dir=" + tiny.train.out_dir + "-a"]), echo=lambda _: None
    )
    piped = train(
        tiny.with_overrides(["train.pipeline=true", f"train.out_dir={tiny.train.out_dir}-b"]),
        echo=lambda _: None,
    )
    assert not plain.model.engine.pipelined and piped.model.engine.pipelined
    assert piped.steps == plain.steps == 12 and piped.model.engine.step == 12  # drained
    a, b = plain.model.engine.embedding_tables, piped.model.engine.embedding_tables
    # consecutive batches share hot ids, so one-step-stale lookups change the trained tables
    assert any(not torch.equal(a[k], b[k]) for k in a)
    assert piped.final["auc"] == pytest.approx(plain.final["auc"], abs=0.05)


def test_pipeline_is_a_boolean_option(tiny: Config) -> None:
    with pytest.raises(ValueError, match=r"\[train\] pipeline must be true or false, got 'yes'"):
        tiny.with_overrides(["train.pipeline=yes"])
