"""``embcore stats DIR`` reports what the engine's profiler wrote and plots it."""

from __future__ import annotations

import torch

import embcore as ec
from embcore.cli.main import main


def test_stats_command_reports_and_plots(tmp_path, capsys):
    table = ec.TableConfig(vocabulary_size=50, dim=4, name="video")
    emb = ec.EmbeddingEngine(
        {"f": ec.FeatureConfig(table=table)},
        optimizer=ec.SGD(),
        profile_data_directory=str(tmp_path / "prof"),
        profile_sample_rate=1.0,
    )
    for _ in range(3):
        emb.enqueue({"f": torch.tensor([7, 7, 7, 1])}, training=False)
        emb.dequeue()
    emb.write_statistics()
    assert main(["stats", str(tmp_path / "prof"), "--plots", str(tmp_path / "png")]) == 0
    out = capsys.readouterr().out
    assert "table video  (50 x 4, 1 feature(s), unsharded)" in out
    assert "sampled batches 3, examples 12, ids 12" in out
    assert "hottest ids (count, undercount <= 0): 7 (9), 1 (3)" in out
    # 7 is 9 of the 12 sampled lookups, 7 and 1 all of them
    assert "covered by the hottest tracked ids (at least): top 1 75.0%, top 2 100.0%" in out
    (png,) = list((tmp_path / "png").glob("*.png"))
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_stats_command_on_a_missing_directory(tmp_path, capsys):
    assert main(["stats", str(tmp_path / "nope")]) == 2
    assert "is not a directory" in capsys.readouterr().err


def test_stats_command_on_a_directory_without_statistics_fails(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "notes.txt").write_text("no statistics here")
    assert main(["stats", str(tmp_path / "empty")]) == 2
    err = capsys.readouterr().err
    assert f"embcore stats: error: {tmp_path / 'empty'} holds no statistics files" in err


def test_a_dynamic_table_is_described_as_unsharded(tmp_path, capsys):
    table = ec.TableConfig(vocabulary_size=None, dim=2, name="user")
    emb = ec.EmbeddingEngine(
        {"u": ec.FeatureConfig(table=table)},
        optimizer=ec.SGD(),
        profile_data_directory=str(tmp_path / "prof"),
        profile_sample_rate=1.0,
    )
    emb({"u": torch.tensor([10**12, 5])})
    emb.write_statistics()
    assert main(["stats", str(tmp_path / "prof"), "--plots", str(tmp_path / "png")]) == 0
    out = capsys.readouterr().out
    assert "table user  (dynamic x 2, 1 feature(s), unsharded)" in out, out
    assert "div" not in out.splitlines()[0]
