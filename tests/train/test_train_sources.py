"""Where a run's rows come from: files are read in a loop, and a resumed run reads on exactly
where the uninterrupted one would; file sources train end to end."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from embcore.data import read_criteo_tsv
from embcore.data.batch import capped_vocab_sizes
from embcore.errors import UserError
from embcore.train.config import Config
from embcore.train.loop import train
from embcore.train.sources import build_source


def _write_tsv(path: Path, n: int, seed: int, labeled: bool = True) -> None:
    rng = np.random.default_rng(seed)
    lines = []
    for i in range(n):
        ints = [str(int(v)) if v >= 0 else "" for v in rng.integers(-1, 50, 13)]
        cats = [f"{int(v):08x}" for v in rng.integers(0, 64, 26)]  # few values: learnable
        label = [str(int(int(cats[0], 16) % 2 == 0 or i % 5 == 0))] if labeled else []
        lines.append("\t".join([*label, *ints, *cats]))
    path.write_text("\n".join(lines) + "\n")


def _config(tiny: Config, tmp_path: Path, source: str, suffix: str) -> Config:
    return tiny.with_overrides(
        [
            f"data.source={source}",
            f"data.path={tmp_path / ('train' + suffix)}",
            f"data.eval_path={tmp_path / ('eval' + suffix)}",
            "data.batch_size=4",
            "data.eval_rows=0",
        ]
    )


def test_file_batches_wrap_around_and_resume_in_place(tiny: Config, tmp_path: Path) -> None:
    _write_tsv(tmp_path / "train.tsv", 10, seed=0)
    _write_tsv(tmp_path / "eval.tsv", 6, seed=1)
    source = build_source(_config(tiny, tmp_path, "criteo_tsv", ".tsv").data)
    stream = source.train_batches(0)
    whole = [next(stream) for _ in range(8)]  # 32 rows: the 10-row file three times and more
    rows = next(
        read_criteo_tsv(tmp_path / "train.tsv", batch_size=10, vocab_sizes=source.vocab_sizes)
    )
    want = torch.cat([rows.sparse] * 4)[:32]
    assert torch.equal(torch.cat([b.sparse for b in whole]), want)
    for start in (1, 2, 3, 7):
        resumed = source.train_batches(start)
        for b in whole[start:]:
            assert torch.equal(next(resumed).sparse, b.sparse)
    assert source.eval_set().rows == 6


def test_training_on_tsv_files_with_resume(tiny: Config, tmp_path: Path) -> None:
    _write_tsv(tmp_path / "train.tsv", 30, seed=0)
    _write_tsv(tmp_path / "eval.tsv", 40, seed=1)
    cfg = _config(tiny, tmp_path, "criteo_tsv", ".tsv")
    whole = train(cfg.with_overrides([f"train.out_dir={tmp_path / 'a'}"]), echo=lambda _: None)
    assert whole.best is None and set(whole.final) == {"auc", "log_loss"}
    split = cfg.with_overrides([f"train.out_dir={tmp_path / 'b'}"])
    train(split, stop_at=9, echo=lambda _: None)
    resumed = train(split, resume=True, echo=lambda _: None)
    assert resumed.history == whole.history


def test_training_on_parquet_files(tiny: Config, tmp_path: Path) -> None:
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    for name, seed in (("train", 0), ("eval", 1)):
        _write_tsv(tmp_path / f"{name}.tsv", 24, seed=seed)
        # the Parquet file holds the same raw values as the TSV file
        lines = [line.split("\t") for line in (tmp_path / f"{name}.tsv").read_text().splitlines()]
        cols = {"label": [int(r[0]) for r in lines]}
        cols |= {
            f"I{i + 1}": [int(r[1 + i]) if r[1 + i] else None for r in lines] for i in range(13)
        }
        cols |= {f"C{i + 1}": [r[14 + i] for r in lines] for i in range(26)}
        pq.write_table(pa.table(cols), tmp_path / f"{name}.parquet")
    tsv = train(_config(tiny, tmp_path, "criteo_tsv", ".tsv"), echo=lambda _: None)
    cfg = _config(tiny, tmp_path, "parquet", ".parquet")
    parquet = train(cfg.with_overrides([f"train.out_dir={tmp_path / 'pq'}"]), echo=lambda _: None)
    assert parquet.history == tsv.history  # the same rows, so the very same run


def test_unlabeled_tsv_rows_have_nan_labels(tmp_path: Path) -> None:
    _write_tsv(tmp_path / "test.tsv", 5, seed=2, labeled=False)
    vocab = capped_vocab_sizes(300)
    (batch,) = read_criteo_tsv(tmp_path / "test.tsv", batch_size=8, vocab_sizes=vocab, labeled=None)
    assert batch.size == 5 and bool(torch.isnan(batch.labels).all())
    with pytest.raises(ValueError, match=r"expected 40 tab-separated columns .* got 39"):
        list(read_criteo_tsv(tmp_path / "test.tsv", batch_size=8, vocab_sizes=vocab))


def test_missing_files_are_named(tiny: Config, tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"\[data\] path: no such file"):
        build_source(_config(tiny, tmp_path, "criteo_tsv", ".tsv").data)


def test_bad_rows_raise_by_default_and_skip_counts_them(tiny: Config, tmp_path: Path) -> None:
    cfg = _config(tiny, tmp_path, "criteo_tsv", ".tsv")
    _write_tsv(tmp_path / "eval.tsv", 40, seed=2)
    _write_tsv(tmp_path / "train.tsv", 60, seed=1)
    lines = (tmp_path / "train.tsv").read_text().splitlines()
    lines[4] = "2" + lines[4][1:]  # line 5: label 2
    lines[30] = lines[30].rsplit("\t", 3)[0]  # line 31: too few columns
    (tmp_path / "train.tsv").write_text("\n".join(lines) + "\n")
    with pytest.raises(UserError, match=rf"{tmp_path / 'train.tsv'}:5: the label must be 0 or 1"):
        train(cfg, echo=lambda _: None)
    assert not Path(cfg.train.out_dir).exists()  # nothing written
    messages: list[str] = []
    skip = cfg.with_overrides(["data.bad_rows=skip"])
    result = train(skip, echo=messages.append)
    assert result.skipped_rows == {str(tmp_path / "train.tsv"): 2, str(tmp_path / "eval.tsv"): 0}
    assert any(m.startswith("skipped 2 malformed row(s)") for m in messages)
    summary = json.loads((Path(cfg.train.out_dir) / "summary.json").read_text())
    assert summary["skipped_rows"][str(tmp_path / "train.tsv")] == 2
