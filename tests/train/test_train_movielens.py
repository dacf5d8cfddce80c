"""``data.source = "movielens"``: epochs of reshuffled batches, an evaluation per epoch, resume,
dynamic tables keyed by the raw ids; on small files in the ml-100k layout made here."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from movielens_files import write_movielens

from embcore.data.movielens import read_movielens
from embcore.errors import UserError
from embcore.train.config import DataConfig, load_config
from embcore.train.loop import train
from embcore.train.movielens_source import MovieLensSource

SETS = [
    "data.source=movielens",
    "data.batch_size=64",
    "model.embedding_dim=4",
    "model.bottom_mlp=[8]",
    "model.top_mlp=[8]",
    "optim.warmup_steps=2",
    "train.epochs=3",
    "train.checkpoint_every=2",
    "train.keep_checkpoints=10",
    "train.progress=false",
    "train.plot=false",
]


def _config(root: Path, out: Path, *sets: str):
    return load_config(None, [*SETS, f"data.path={root}", f"train.out_dir={out}", *sets])


def test_each_epoch_visits_every_training_rating_once_in_its_own_order(tmp_path: Path) -> None:
    write_movielens(tmp_path, ratings=300)  # 240 train: 4 batches of 64 a epoch, the last 48
    cfg = DataConfig(source="movielens", path=str(tmp_path), batch_size=64)
    source = MovieLensSource(cfg, keys=True, vocab_sizes=[10] * 8)
    again = MovieLensSource(cfg, keys=True, vocab_sizes=[10] * 8)
    assert source.steps_per_epoch == 4
    data = read_movielens(tmp_path)
    train_keys = {tuple(k) for k in data.keys[: data.train_rows, :2].tolist()}  # (user, movie)
    stream = source.train_batches(0)
    orders = []
    for _ in range(2):
        batches = [next(stream) for _ in range(4)]
        assert [b.size for b in batches] == [64, 64, 64, 48]
        seen = [tuple(k) for b in batches for k in b.sparse[:, :2].tolist()]
        assert sorted(seen) == sorted(train_keys)
        orders.append(seen)
    assert orders[0] != orders[1]  # reshuffled
    resumed = next(again.train_batches(5))  # epoch 1, batch 1, from a fresh source
    assert [tuple(k) for k in resumed.sparse[:, :2].tolist()] == orders[1][64:128]
    held = source.eval_set()
    assert held.rows == 60
    np.testing.assert_array_equal(held.labels, data.labels[data.train_rows :])


def test_trains_epochs_evaluating_after_each(tmp_path: Path) -> None:
    write_movielens(tmp_path / "ml", ratings=300)
    lines: list[str] = []
    result = train(_config(tmp_path / "ml", tmp_path / "run"), echo=lines.append)
    assert result.steps == 12
    assert [e["step"] for e in result.history["eval"]] == [4, 8, 12]
    assert any(line.startswith("data: MovieLens ratings of") for line in lines)
    assert any("4 steps per epoch" in line for line in lines)


def test_resume_ends_as_an_uninterrupted_run(tmp_path: Path) -> None:
    write_movielens(tmp_path / "ml", ratings=300)
    whole = train(_config(tmp_path / "ml", tmp_path / "a"), echo=lambda s: None)
    cfg = _config(tmp_path / "ml", tmp_path / "b")
    train(cfg, stop_at=6, echo=lambda s: None)
    resumed = train(cfg, resume=True, echo=lambda s: None)
    assert resumed.resumed_from == 6
    assert resumed.history == whole.history
    for key, value in whole.model.state_dict().items():
        torch.testing.assert_close(resumed.model.state_dict()[key], value, rtol=0, atol=0)


def test_dynamic_tables_hold_the_raw_ids_of_the_training_ratings(tmp_path: Path) -> None:
    write_movielens(tmp_path / "ml", ratings=300)
    result = train(
        _config(tmp_path / "ml", tmp_path / "run", "model.tables=dynamic", "train.epochs=1"),
        echo=lambda s: None,
    )
    data = read_movielens(tmp_path / "ml")
    keys = data.keys[: data.train_rows]
    engine = result.model.engine
    for column, name in enumerate(["user_id", "movie_id", "gender", "occupation"]):
        assert sorted(engine.table_keys(name).tolist()) == sorted(set(keys[:, column].tolist()))
    genres = keys[:, -6:]
    assert sorted(engine.table_keys("genres").tolist()) == sorted(set(genres[genres >= 0].tolist()))


def test_a_missing_directory_is_one_clear_error(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="no such directory"):
        train(_config(tmp_path / "nope", tmp_path / "run"), echo=lambda s: None)
    with pytest.raises(UserError, match=r"\[data\] path must be a directory"):
        load_config(None, ["data.source=movielens"])
