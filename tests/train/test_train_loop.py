"""The training loop: it learns, and a run stopped and resumed equals an uninterrupted one."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from embcore.train.config import Config
from embcore.train.loop import TrainResult, evaluate, train
from embcore.train.run_state import list_checkpoints, load_checkpoint
from embcore.train.sources import build_source


def _quiet(_: str) -> None:
    pass


def _same_state(a: TrainResult, b: TrainResult) -> None:
    sa, sb = a.model.state_dict(), b.model.state_dict()
    assert sa.keys() == sb.keys()
    for key in sa:
        assert torch.equal(sa[key], sb[key]), key


def test_training_learns_and_reports_against_the_best_reachable(tiny: Config) -> None:
    cfg = tiny.with_overrides(
        ["train.steps=60", "train.eval_every=30", "train.checkpoint_every=30"]
    )
    result = train(cfg, echo=_quiet)
    evals = result.history["eval"]
    assert [e["step"] for e in evals] == [30, 60]
    assert [s for s, _ in result.history["loss"]] == list(range(2, 61, 2))
    assert result.best is not None
    assert 0.6 < result.final["auc"] <= result.best["auc"] + 0.01
    assert result.final["auc"] > 0.55  # well above chance after 60 tiny steps
    # the reported metric is the model's on the held-out rows
    source = build_source(cfg.data)
    eval_set = source.eval_set()
    from embcore.train.metrics import auc

    assert auc(eval_set.labels, evaluate(result.model, eval_set)) == result.final["auc"]
    assert [s for s, _ in list_checkpoints(Path(cfg.train.out_dir) / "checkpoints")] == [30, 60]
    assert (Path(cfg.train.out_dir) / "summary.json").is_file()


@pytest.mark.parametrize("stop_at", [6, 8])  # between checkpoints, and right on one
def test_a_resumed_run_ends_exactly_like_an_uninterrupted_one(
    tiny: Config, tmp_path: Path, stop_at: int
) -> None:
    whole = train(tiny.with_overrides([f"train.out_dir={tmp_path / 'whole'}"]), echo=_quiet)
    cfg = tiny.with_overrides([f"train.out_dir={tmp_path / 'split'}"])
    first = train(cfg, stop_at=stop_at, echo=_quiet)
    assert first.steps == stop_at
    resumed = train(cfg, resume=True, echo=_quiet)
    assert resumed.resumed_from == 4 * (stop_at // 4)  # the last checkpoint before the stop
    assert resumed.steps == whole.steps == 12
    assert resumed.history == whole.history  # every loss point and every evaluation
    assert resumed.final == whole.final
    _same_state(resumed, whole)  # dense weights, tables, slots and the engine's step
    # the final checkpoints agree in every tensor (Adam's state and the RNG included)
    a, meta_a = load_checkpoint(resumed.checkpoint)
    b, meta_b = load_checkpoint(whole.checkpoint)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert meta_a["optimizer"] == meta_b["optimizer"] and meta_a["history"] == meta_b["history"]


def test_resume_refuses_a_changed_model_but_allows_more_steps(tiny: Config) -> None:
    train(tiny, stop_at=4, echo=_quiet)
    with pytest.raises(
        ValueError, match=r"differs from checkpoint .* in \['model.embedding_dim'\]"
    ):
        train(tiny.with_overrides(["model.embedding_dim=8"]), resume=True, echo=_quiet)
    longer = train(tiny.with_overrides(["train.steps=16"]), resume=True, echo=_quiet)
    assert longer.steps == 16 and longer.resumed_from == 4


def test_a_fresh_run_replaces_old_checkpoints(tiny: Config) -> None:
    messages: list[str] = []
    train(tiny, stop_at=8, echo=_quiet)
    result = train(tiny.with_overrides(["train.steps=4"]), echo=messages.append)
    assert any("removing the earlier checkpoints" in m for m in messages)
    assert result.resumed_from == 0
    ckpts = list_checkpoints(Path(tiny.train.out_dir) / "checkpoints")
    assert [s for s, _ in ckpts] == [4]


def test_dcn_interaction_trains(tiny: Config) -> None:
    result = train(tiny.with_overrides(["model.interaction=dcn", "model.dcn_rank=4"]), echo=_quiet)
    assert np.isfinite(result.final["log_loss"]) and result.final["auc"] > 0.5
