"""``embcore plan`` with a dynamic table: its expected rows from ``max_rows`` or ``--stats``
(the memory column follows), and a clear error with neither."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from embcore.cli.main import main

MIB = 2**20


def _plan(tmp_path: Path, tables: list[dict], *extra: str) -> list[str]:
    config = tmp_path / "tables.json"
    config.write_text(json.dumps({"tables": tables, "optimizer": "adagrad"}))
    return ["plan", "--config", str(config), "--world-size", "2", *extra]


def _memory(out: str, table: str) -> float:
    line = next(x for x in out.splitlines() if x.startswith(table + " "))
    value, unit = line.split()[-4:-2]
    return float(value) * {"MiB": MIB, "KiB": 1024, "GiB": 2**30}[unit]


def test_max_rows_sizes_a_dynamic_table(tmp_path: Path, capsys) -> None:
    user = {"name": "user", "vocabulary_size": None, "dim": 64, "max_rows": 2_000_000}
    assert main(_plan(tmp_path, [user])) == 0
    want = 2_000_000 * 64 * 4 * 2  # weights + Adagrad's accumulator
    assert _memory(capsys.readouterr().out, "user") == pytest.approx(want, rel=1e-4)


def test_statistics_size_a_dynamic_table_without_max_rows(tmp_path: Path, capsys) -> None:
    stats = tmp_path / "stats.json"
    stats.write_text(json.dumps({"user": {"ids_per_example": 1, "rows_held": 12_345}}))
    user = {"name": "user", "vocabulary_size": None, "dim": 64}
    assert main(_plan(tmp_path, [user], "--stats", str(stats))) == 0
    out = capsys.readouterr().out
    assert _memory(out, "user") == pytest.approx(12_345 * 64 * 4 * 2, rel=1e-3)


def test_a_dynamic_table_with_no_size_is_a_clear_error(tmp_path: Path, capsys) -> None:
    user = {"name": "user", "vocabulary_size": None, "dim": 64}
    assert main(_plan(tmp_path, [user])) == 2
    err = capsys.readouterr().err
    assert "dynamic table 'user' has no expected size" in err and "Traceback" not in err


def test_max_rows_on_a_fixed_table_is_refused(tmp_path: Path, capsys) -> None:
    item = {"name": "item", "vocabulary_size": 100, "dim": 8, "max_rows": 10}
    assert main(_plan(tmp_path, [item])) == 2
    assert "max_rows is for dynamic tables" in capsys.readouterr().err
