"""The main job's raw 64-bit ids (``data.raw_ids``) and its table kinds (``model.tables``):
the source mixes the synthetic ids, fixed tables fold them, the config checks its keys."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from embcore.errors import UserError
from embcore.train.config import Config, DataConfig, ModelConfig
from embcore.train.loop import train
from embcore.train.model import FoldedDLRM, build_model
from embcore.train.sources import SyntheticSource, raw_ids

MASK = (1 << 64) - 1


def _splitmix(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK
    x ^= x >> 31
    return x - (1 << 64) if x >= 1 << 63 else x


def test_raw_ids_mix_each_column_with_its_own_salt() -> None:
    ids = np.array([[0, 0, 5], [7, 2**40, 5]], dtype=np.int64)
    got = raw_ids(ids)
    expected = [[_splitmix(int(v) + (f << 40)) for f, v in enumerate(row)] for row in ids]
    assert got.tolist() == expected
    many = raw_ids(np.repeat(np.arange(50_000, dtype=np.int64)[:, None], 3, axis=1))
    assert all(np.unique(many[:, f]).size == 50_000 for f in range(3))  # no collisions
    assert (many < 0).any()


def test_the_raw_source_is_the_plain_source_mixed() -> None:
    plain = SyntheticSource(DataConfig(vocab_cap=500, batch_size=64, eval_rows=100))
    raw = SyntheticSource(DataConfig(vocab_cap=500, batch_size=64, eval_rows=100, raw_ids=True))
    a, b = next(plain.train_batches(3)), next(raw.train_batches(3))
    assert torch.equal(a.dense, b.dense) and torch.equal(a.labels, b.labels)
    assert b.sparse.numpy().tolist() == raw_ids(a.sparse.numpy()).tolist()
    ea, eb = plain.eval_set(), raw.eval_set()
    np.testing.assert_array_equal(ea.true_probs, eb.true_probs)  # the same hidden model
    assert eb.batches[0].sparse.numpy().tolist() == raw_ids(ea.batches[0].sparse.numpy()).tolist()
    assert "raw 64-bit ids" in raw.describe()


def test_raw_ids_mean_the_same_for_every_source() -> None:
    from embcore.train.contract import id_mode, source_gives_keys

    files = {"path": "a.tsv", "eval_path": "b.tsv"}
    for source, where in (("criteo_tsv", files), ("parquet", files), ("movielens", {"path": "d"})):
        for raw, tables, mode in (
            (False, "fixed", "rows"),
            (True, "fixed", "folded"),
            (False, "dynamic", "keys"),
            (True, "dynamic", "keys"),
        ):
            data = DataConfig(source=source, raw_ids=raw, **where)
            config = Config(data=data, model=ModelConfig(tables=tables))
            assert id_mode(config) == mode
            assert source_gives_keys(config) == (mode != "rows")


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("tables", "hashed", r"\[model\] tables must be one of \['fixed', 'dynamic'\]"),
        ("min_count", 0, r"\[model\] min_count must be an int >= 1, got 0"),
        ("steps_to_live", -1, r"\[model\] steps_to_live must be an int >= 0"),
        ("max_rows", -5, r"\[model\] max_rows must be an int >= 0"),
    ],
)
def test_bad_table_settings_name_the_key(key: str, value: object, message: str) -> None:
    with pytest.raises(UserError, match=message):
        ModelConfig(**{key: value})


def test_fixed_tables_fold_raw_ids_by_floored_modulo() -> None:
    cfg = ModelConfig(embedding_dim=4, bottom_mlp=(8,), top_mlp=(8,))
    vocab = [3 + f for f in range(26)]
    model = build_model(cfg, vocab, optimizer=None, seed=0, raw_ids=True)
    assert isinstance(model, FoldedDLRM)
    ids = raw_ids(np.arange(26 * 4, dtype=np.int64).reshape(4, 26))
    features = model.features(torch.from_numpy(ids))
    for f, name in enumerate(model.sparse_names):
        expected = [int(v) % vocab[f] for v in ids[:, f]]  # Python's % is floored
        assert features[name].tolist() == expected
    plain = build_model(cfg, vocab, optimizer=None, seed=0)
    assert type(plain) is not FoldedDLRM  # without raw ids nothing is folded


def test_a_raw_id_run_with_fixed_tables_learns_and_serves(tiny: Config, capsys) -> None:
    from embcore.cli.main import main
    from embcore.data.batch import capped_vocab_sizes
    from embcore.train.loop import evaluate
    from embcore.train.sources import build_source

    cfg = tiny.with_overrides(["data.raw_ids=true", "train.steps=40", "train.eval_every=40"])
    result = train(cfg, echo=lambda _: None)
    assert result.final["auc"] > 0.55  # the folded ids still carry the signal
    summary = json.loads((Path(cfg.train.out_dir) / "summary.json").read_text())
    assert summary["embedding_rows"] == sum(capped_vocab_sizes(300))
    # the bundle folds the raw held-out ids as training did: the same scores
    run = cfg.train.out_dir
    scores = Path(run) / "scores.npy"
    assert main(["export", "--run", run]) == 0
    assert main(["predict", "--bundle", f"{run}/export", "--output", str(scores)]) == 0
    assert f"AUC {result.final['auc']:.4f}" in capsys.readouterr().out
    eval_set = build_source(cfg.data).eval_set()
    np.testing.assert_allclose(np.load(scores), evaluate(result.model, eval_set), atol=1e-6)
