"""``embcore bench --mainjob``: its files and BENCHMARKS.md's main-job section (a tiny
config, eager systems only; no timing assertions)."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from embcore.cli.main import main

TINY = ["--set", "data.batch_size=16", "--set", "data.vocab_cap=200", "--set", "data.eval_rows=32"]


def test_mainjob_writes_its_section_into_the_named_markdown(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    doc = tmp_path / "BENCHMARKS.md"
    doc.write_text("# BENCHMARKS\n\n## Results\n\nsuite table\n\n## Hashing\n\nhashes\n")
    argv = ["bench", "--mainjob", "--no-compile", "--repeats", "1", "--warmup", "0"]
    argv += ["--steps", "1", "--out", str(tmp_path / "out"), "--markdown", str(doc), *TINY]
    monkeypatch.setattr(sys, "argv", ["embcore", *argv])  # the command line it names
    assert main(argv) == 0
    text = doc.read_text()
    assert text.index("suite table") < text.index("## Main job") < text.index("## Hashing")
    assert "| plain PyTorch |" in text and "hashes" in text
    assert "embcore bench --mainjob --no-compile --repeats 1" in text  # what regenerates it
    assert (tmp_path / "out" / "mainjob.json").is_file()


def test_mainjob_with_overrides_leaves_benchmarks_md_alone(tmp_path: Path) -> None:
    argv = ["bench", "--mainjob", "--no-compile", "--repeats", "1", "--warmup", "0"]
    argv += ["--steps", "1", "--out", str(tmp_path / "out"), "--write-benchmarks", *TINY]
    before = (Path(__file__).resolve().parents[2] / "BENCHMARKS.md").read_text()
    assert main(argv) == 0
    assert (Path(__file__).resolve().parents[2] / "BENCHMARKS.md").read_text() == before
    assert "| embcore |" in (tmp_path / "out" / "mainjob.md").read_text()


def test_quick_is_a_smoke_test_without_speeds_and_leaves_benchmarks_md_alone(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    doc = Path(__file__).resolve().parents[2] / "BENCHMARKS.md"
    before = doc.read_text()
    argv = ["bench", "--quick", "--workloads", "W1-quick", "--optimizers", "adagrad"]
    argv += ["--systems", "embcore_engine", "plain_torch", "--warmup", "0", "--steps", "1"]
    assert main([*argv, "--out", str(tmp_path / "out")]) == 0
    out = capsys.readouterr().out
    assert "smoke test passed" in out and "not speed" in out
    assert not re.search(r"\d\s*x\b|speedup", out), out  # no ratio, no speed-up table
    assert doc.read_text() == before
    assert (tmp_path / "out" / "results.json").is_file()


def test_bench_options_have_help(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["bench", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--warmup WARMUP untimed steps before the timed ones" in text
    assert "--write-benchmarks regenerate the checkout's BENCHMARKS.md" in text
    assert "a smoke test at tiny CI sizes" in text
