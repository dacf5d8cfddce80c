"""The training loop: it learns, and a run stopped and resumed equals an uninterrupted one."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from embcore.errors import UserError
from embcore.train import loop
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


def test_a_new_run_over_an_earlier_one_is_refused_and_changes_nothing(tiny: Config) -> None:
    train(tiny, stop_at=8, echo=_quiet)
    ckpt_dir = Path(tiny.train.out_dir) / "checkpoints"
    before = {p.name: p.read_bytes() for p in ckpt_dir.iterdir()}
    with pytest.raises(UserError, match=r"already holds 2 checkpoint\(s\).*--resume.*--overwrite"):
        train(tiny.with_overrides(["train.steps=4"]), echo=_quiet)
    assert {p.name: p.read_bytes() for p in ckpt_dir.iterdir()} == before


def test_overwrite_keeps_the_earlier_run_until_the_first_new_checkpoint(
    tiny: Config, monkeypatch: pytest.MonkeyPatch
) -> None:
    train(tiny, echo=_quiet)  # a whole run: checkpoints and summary.json
    out = Path(tiny.train.out_dir)
    earlier = {p.name for p in (out / "checkpoints").iterdir()}
    # The new run fails writing its first checkpoint (an injected fault): nothing is lost.
    with monkeypatch.context() as patch:
        patch.setattr(loop, "save_checkpoint", _disk_full)
        with pytest.raises(OSError, match="injected"):
            train(tiny, overwrite=True, echo=_quiet)
    kept = out / "checkpoints.replaced"
    assert {p.name for p in kept.iterdir()} == earlier
    assert (out / "summary.json").is_file()
    # A run that does publish removes the earlier one's files.
    messages: list[str] = []
    result = train(tiny.with_overrides(["train.steps=4"]), overwrite=True, echo=messages.append)
    assert result.resumed_from == 0
    assert [s for s, _ in list_checkpoints(out / "checkpoints")] == [4]
    assert not kept.exists()
    assert json.loads((out / "summary.json").read_text())["steps"] == 4


def _disk_full(*args: object) -> None:
    raise OSError(28, "injected: no space left on device")


def test_dcn_interaction_trains(tiny: Config) -> None:
    result = train(tiny.with_overrides(["model.interaction=dcn", "model.dcn_rank=4"]), echo=_quiet)
    assert np.isfinite(result.final["log_loss"]) and result.final["auc"] > 0.5


def test_progress_is_one_line_at_a_time_when_not_a_terminal(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import io

    from embcore.train import progress as module
    from embcore.train.progress import Progress, progress

    monkeypatch.setattr(module, "LINE_SECONDS", 1e9)  # no clock in this test
    log = io.StringIO()  # not a terminal
    bar = progress(True, 12, 0, 64, stream=log)
    assert type(bar) is Progress
    for step in range(1, 13):
        bar.update(64, 0.5 + step / 100 if step % 2 == 0 else None)
    lines = log.getvalue().splitlines()
    assert "\r" not in log.getvalue()
    # the first loss point, then (no LINE_SECONDS passed) only the last step
    assert lines[0].startswith("step 2/12 (17%)") and lines[0].endswith("loss 0.5200")
    assert lines[-1].startswith("step 12/12 (100%)") and lines[-1].endswith("loss 0.6200")
    assert all(" samples/s" in line for line in lines) and len(lines) == 2
