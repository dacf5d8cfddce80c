"""``--resume`` finds a run wherever it lives, refuses a run it would not continue (saying how
to set it back), and continues the run an interrupted ``--overwrite`` was replacing."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from embcore.errors import UserError
from embcore.train import loop
from embcore.train.config import Config
from embcore.train.loop import Interrupted, TrainResult, train
from embcore.train.run_state import list_checkpoints


def _quiet(_: str) -> None:
    pass


def _steps(out: Path) -> list[int]:
    return [s for s, _ in list_checkpoints(out / "checkpoints")]


@pytest.fixture
def whole(tiny: Config, tmp_path: Path) -> TrainResult:
    """The tiny job run without a stop: what every resumed run below must end as."""
    return train(tiny.with_overrides([f"train.out_dir={tmp_path / 'whole'}"]), echo=_quiet)


def _same_run(resumed: TrainResult, whole: TrainResult) -> None:
    assert resumed.steps == whole.steps == 12
    assert resumed.history == whole.history and resumed.final == whole.final


def test_a_run_is_found_by_a_relative_and_by_an_absolute_path(
    tiny: Config, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, whole: TrainResult
) -> None:
    monkeypatch.chdir(tmp_path)
    train(tiny.with_overrides(["train.out_dir=rel"]), stop_at=6, echo=_quiet)
    messages: list[str] = []
    absolute = tiny.with_overrides([f"train.out_dir={tmp_path / 'rel'}"])
    resumed = train(absolute, resume=True, echo=messages.append)  # another launch, another path
    assert resumed.resumed_from == 4
    _same_run(resumed, whole)
    assert not [m for m in messages if "out_dir" in m]  # nothing to say about where it lives


def test_a_moved_run_resumes_where_it_now_is(
    tiny: Config, tmp_path: Path, whole: TrainResult
) -> None:
    first = tiny.with_overrides([f"train.out_dir={tmp_path / 'disk_a' / 'run'}"])
    train(first, stop_at=8, echo=_quiet)
    moved = tmp_path / "disk_b" / "run"
    moved.parent.mkdir()
    shutil.move(tmp_path / "disk_a" / "run", moved)
    resumed = train(tiny.with_overrides([f"train.out_dir={moved}"]), resume=True, echo=_quiet)
    assert resumed.resumed_from == 8
    _same_run(resumed, whole)
    assert _steps(moved) == [4, 8, 12]


def test_a_copied_run_branches_and_leaves_the_original_alone(
    tiny: Config, tmp_path: Path, whole: TrainResult
) -> None:
    original = tmp_path / "run"
    train(tiny.with_overrides([f"train.out_dir={original}"]), stop_at=4, echo=_quiet)
    before = {p.name: p.read_bytes() for p in (original / "checkpoints").iterdir()}
    branch = tmp_path / "branch"
    shutil.copytree(original, branch)
    resumed = train(tiny.with_overrides([f"train.out_dir={branch}"]), resume=True, echo=_quiet)
    _same_run(resumed, whole)
    assert {p.name: p.read_bytes() for p in (original / "checkpoints").iterdir()} == before


def test_a_changed_model_is_refused_with_both_values_and_the_way_back(tiny: Config) -> None:
    train(tiny, stop_at=4, echo=_quiet)
    changed = tiny.with_overrides(["model.embedding_dim=8", "model.bottom_mlp=[8, 8]"])
    with pytest.raises(UserError) as info:
        train(changed, resume=True, echo=_quiet)
    message = str(info.value)
    assert "['model.embedding_dim', 'model.bottom_mlp']" in message, message
    assert "model.embedding_dim = 4 there, 8 now" in message, message
    assert "model.bottom_mlp = [8] there, [8, 8] now" in message, message
    assert "add --set model.embedding_dim=4 --set model.bottom_mlp=[8] to resume" in message
    assert "--overwrite" in message and "start afresh" not in message
    assert _steps(Path(tiny.train.out_dir)) == [4]  # nothing written


def _ctrl_c_at(step: int):
    """A stand-in for the schedule that presses Ctrl-C when the loop reaches ``step``."""
    rate = loop.dense_lr

    def dense_lr(cfg, now, steps):  # type: ignore[no-untyped-def]
        if now == step:
            raise KeyboardInterrupt
        return rate(cfg, now, steps)

    return dense_lr


def test_an_interrupted_overwrite_keeps_the_earlier_run_and_resume_continues_it(
    tiny: Config, monkeypatch: pytest.MonkeyPatch, whole: TrainResult
) -> None:
    out = Path(tiny.train.out_dir)
    train(tiny, stop_at=8, echo=_quiet)  # the earlier run: checkpoints at steps 4 and 8
    kept = out / "checkpoints.replaced"
    with monkeypatch.context() as patch:
        patch.setattr(loop, "dense_lr", _ctrl_c_at(3))
        with pytest.raises(Interrupted) as info:
            train(tiny, overwrite=True, echo=_quiet)
    message = str(info.value)
    assert f"the earlier run it was replacing is kept in {kept}" in message, message
    assert "step_00000008" in message and "add --resume to continue that run" in message
    assert _steps(out) == [] and [s for s, _ in list_checkpoints(kept)] == [4, 8]
    # the next plain run is refused, saying the same
    with pytest.raises(UserError) as refused:
        train(tiny, echo=_quiet)
    assert f"kept in {kept}" in str(refused.value) and "--resume" in str(refused.value)
    # and --resume does what both said: it continues the earlier run from step 8
    messages: list[str] = []
    resumed = train(tiny, resume=True, echo=messages.append)
    assert resumed.resumed_from == 8, messages
    assert any(f"moved back from {kept}" in m for m in messages), messages
    _same_run(resumed, whole)
    assert not kept.exists() and _steps(out) == [4, 8, 12]


def test_ctrl_c_before_the_first_checkpoint_of_a_fresh_run_has_nothing_to_resume(
    tiny: Config, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(loop, "dense_lr", _ctrl_c_at(2))
    with pytest.raises(Interrupted, match="before the first checkpoint: nothing to resume"):
        train(tiny, echo=_quiet)


def _ctrl_c(*args: object, **kwargs: object) -> None:
    raise KeyboardInterrupt


def test_ctrl_c_while_setting_up_says_nothing_was_written(
    tiny: Config, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(loop, "build_source", _ctrl_c)  # reading the data
    with pytest.raises(Interrupted, match="before the first step; nothing was written"):
        train(tiny, echo=_quiet)
    assert not Path(tiny.train.out_dir).exists()


def test_ctrl_c_while_an_overwrite_sets_up_keeps_the_earlier_run(
    tiny: Config, monkeypatch: pytest.MonkeyPatch, whole: TrainResult
) -> None:
    out = Path(tiny.train.out_dir)
    train(tiny, stop_at=8, echo=_quiet)
    with monkeypatch.context() as patch:
        patch.setattr(loop, "progress", _ctrl_c)  # after the earlier run was set aside
        with pytest.raises(Interrupted) as info:
            train(tiny, overwrite=True, echo=_quiet)
    assert f"before the first step, before this run's first checkpoint; the earlier run it " \
        f"was replacing is kept in {out / 'checkpoints.replaced'}" in str(info.value)  # fmt: skip
    resumed = train(tiny, resume=True, echo=_quiet)
    assert resumed.resumed_from == 8
    _same_run(resumed, whole)


def test_the_command_line_prints_the_interruption(
    tiny_sets: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    from embcore.cli.main import main

    monkeypatch.setattr(loop, "build_source", _ctrl_c)
    args = ["train", "--set", f"train.out_dir={tmp_path / 'run'}"]
    for s in tiny_sets:
        args += ["--set", s]
    assert main(args) == 130
    err = capsys.readouterr().err
    assert err.startswith("embcore train: interrupted before the first step; nothing was written")
