"""The main job with dynamic tables (``model.tables = "dynamic"``): every raw id seen gets its
own row, eviction bounds the rows, and a resumed run ends exactly like an uninterrupted one."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import torch

from embcore.data.batch import SPARSE_NAMES
from embcore.train.config import Config
from embcore.train.loop import train
from embcore.train.model import embedding_rows
from embcore.train.run_state import load_checkpoint
from embcore.train.sources import build_source

DYNAMIC = ['model.tables="dynamic"', "data.raw_ids=true"]


def _quiet(_: str) -> None:
    pass


def _distinct_per_feature(cfg: Config) -> list[int]:
    """Distinct raw ids of each feature over the run's training batches, from the source."""
    batches = itertools.islice(build_source(cfg.data).train_batches(0), cfg.train.steps)
    ids = np.concatenate([b.sparse.numpy() for b in batches])
    return [np.unique(ids[:, f]).size for f in range(ids.shape[1])]


def test_every_raw_id_seen_in_training_holds_a_row(tiny: Config) -> None:
    cfg = tiny.with_overrides(DYNAMIC)
    result = train(cfg, echo=_quiet)
    engine = result.model.engine
    distinct = _distinct_per_feature(cfg)
    held = [engine.table_info(name)["rows"] for name in SPARSE_NAMES]
    assert held == distinct  # admitted on first sight, never evicted, eval inserted nothing
    assert embedding_rows(result.model) == sum(distinct)
    assert all(t.vocabulary_size is None for t in engine.tables)
    first = next(build_source(cfg.data).train_batches(0)).sparse[:, 0]
    assert torch.isin(first, engine.table_keys("C1")).all()


def test_max_rows_bounds_every_table(tiny: Config) -> None:
    cfg = tiny.with_overrides([*DYNAMIC, "model.max_rows=40", "model.steps_to_live=100"])
    result = train(cfg, echo=_quiet)
    engine = result.model.engine
    assert engine.tables[0].config.eviction.max_rows == 40
    held = [engine.table_info(name)["rows"] for name in SPARSE_NAMES]
    # rows only leave past 40 (no key is 100 steps old): min(40, distinct ids seen)
    assert held == [min(40, n) for n in _distinct_per_feature(cfg)]


def test_min_count_admits_only_repeated_ids(tiny: Config) -> None:
    cfg = tiny.with_overrides([*DYNAMIC, "model.min_count=3"])
    result = train(cfg, echo=_quiet)
    batches = itertools.islice(build_source(cfg.data).train_batches(0), cfg.train.steps)
    ids = np.concatenate([b.sparse.numpy() for b in batches])
    for f in (0, 2, 11):
        keys, counts = np.unique(ids[:, f], return_counts=True)
        held = result.model.engine.table_keys(SPARSE_NAMES[f]).numpy()
        np.testing.assert_array_equal(held, keys[counts >= 3])


def test_a_resumed_dynamic_run_ends_exactly_like_an_uninterrupted_one(
    tiny: Config, tmp_path: Path
) -> None:
    base = tiny.with_overrides([*DYNAMIC, "model.max_rows=60"])
    whole = train(base.with_overrides([f"train.out_dir={tmp_path / 'whole'}"]), echo=_quiet)
    cfg = base.with_overrides([f"train.out_dir={tmp_path / 'split'}"])
    train(cfg, stop_at=6, echo=_quiet)
    resumed = train(cfg, resume=True, echo=_quiet)
    assert resumed.resumed_from == 4 and resumed.history == whole.history
    a, _ = load_checkpoint(resumed.checkpoint)
    b, _ = load_checkpoint(whole.checkpoint)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert any(k.endswith("C3.keys") for k in a)  # the dynamic tables' keys are in it


def test_a_dynamic_run_exports_and_serves_its_scores(tiny: Config, capsys) -> None:
    from embcore.cli.main import main
    from embcore.train.loop import evaluate

    cfg = tiny.with_overrides(DYNAMIC)
    result = train(cfg, echo=_quiet)
    run = cfg.train.out_dir
    assert main(["export", "--run", run, "--format", "pt2"]) == 0
    eval_set = build_source(cfg.data).eval_set()
    for extra in ([], ["--format", "pt2", "--trusted-program"]):  # tensors, then the program
        scores = Path(run) / "scores.npy"
        args = ["predict", "--bundle", f"{run}/export", "--output", str(scores), *extra]
        assert main(args) == 0
        assert f"AUC {result.final['auc']:.4f}" in capsys.readouterr().out
        np.testing.assert_allclose(np.load(scores), evaluate(result.model, eval_set), atol=1e-5)


def test_initial_capacity_reaches_every_table_and_changes_no_result(
    tiny: Config, tmp_path: Path
) -> None:
    """``model.initial_capacity`` reserves keys in each dynamic table (fewer than a table
    gets, so it also grows past them); losses, rows and checkpoints are those without."""
    base = tiny.with_overrides([*DYNAMIC, "model.max_rows=60", "model.steps_to_live=5"])
    plain = train(base.with_overrides([f"train.out_dir={tmp_path / 'plain'}"]), echo=_quiet)
    hinted_cfg = base.with_overrides(
        ["model.initial_capacity=20", f"train.out_dir={tmp_path / 'hinted'}"]
    )
    hinted = train(hinted_cfg, echo=_quiet)
    assert [t.config.initial_capacity for t in hinted.model.engine.tables] == [20] * len(
        SPARSE_NAMES
    )
    assert all(t.config.initial_capacity is None for t in plain.model.engine.tables)
    assert hinted.history == plain.history
    assert hinted.final == plain.final
    rows = [plain.model.engine.table_info(n)["rows"] for n in SPARSE_NAMES]
    assert [hinted.model.engine.table_info(n)["rows"] for n in SPARSE_NAMES] == rows
    assert max(rows) > 20
    a, _ = load_checkpoint(hinted.checkpoint)
    b, _ = load_checkpoint(plain.checkpoint)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
