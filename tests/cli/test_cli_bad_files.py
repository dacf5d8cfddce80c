"""Every file a command reads, damaged every way: one line naming the file, status 2, no traceback.

Files: the TOML config, TSV (plain and gzip) and Parquet data, a training checkpoint (resume and
export), a serving bundle's JSON and safetensors, ``plan``'s JSON config and statistics, and a
profile directory's statistics. Damage: missing, a directory, empty, truncated, binary, a file
of another kind, and well-formed but with values out of range. The matrix runs in-process
through ``embcore.cli.main.main`` (what ``python -m embcore.cli.main`` calls); one case per
command also runs as a real subprocess.
"""

from __future__ import annotations

import gzip
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch

from embcore.cli.main import main
from embcore.train.config import load_config
from embcore.train.loop import train

TINY = [
    "data.vocab_cap=50",
    "data.batch_size=16",
    "data.eval_rows=64",
    "model.embedding_dim=2",
    "model.bottom_mlp=[4]",
    "model.top_mlp=[4]",
    "optim.warmup_steps=1",
    "train.steps=2",
    "train.eval_every=2",
    "train.checkpoint_every=2",
    "train.progress=false",
    "train.plot=false",
]

KINDS = ["missing", "directory", "empty", "truncated", "binary", "other_kind", "out_of_range"]


def _tsv_rows(n: int, seed: int = 0) -> str:
    rng = np.random.default_rng(seed)
    lines = []
    for _ in range(n):
        label = str(rng.integers(0, 2))
        ints = [str(v) for v in rng.integers(0, 100, 13)]
        cats = [f"{v:08x}" for v in rng.integers(0, 2**32, 26)]
        lines.append("\t".join([label, *ints, *cats]))
    return "\n".join(lines) + "\n"


def _parquet(path: Path, text: str, label: int | None = None) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [line.split("\t") for line in text.splitlines()]
    columns = {"label": [int(r[0]) if label is None else label for r in rows]}
    columns |= {f"I{i + 1}": [int(r[1 + i]) for r in rows] for i in range(13)}
    columns |= {f"C{i + 1}": [r[14 + i] for r in rows] for i in range(26)}
    pq.write_table(pa.table(columns), path)


@dataclass
class Workspace:
    """Valid files of every kind, and a trained run to export and resume."""

    root: Path
    tsv: str
    run: Path
    bundle: Path

    def copy_run(self, to: Path) -> Path:
        shutil.copytree(self.run, to)
        return to


@pytest.fixture(scope="module")
def ws(tmp_path_factory: pytest.TempPathFactory) -> Workspace:
    root = tmp_path_factory.mktemp("valid")
    run = root / "run"
    train(load_config(None, [*TINY, f"train.out_dir={run}"]), echo=lambda _: None)
    bundle = root / "bundle"
    assert main(["export", "--run", str(run), "--out", str(bundle)]) == 0
    return Workspace(root, _tsv_rows(40), run, bundle)


def _damage(path: Path, kind: str, valid: bytes, other: bytes, out_of_range: bytes) -> None:
    """Put a damaged file of ``kind`` at ``path`` (which does not exist yet)."""
    if kind == "missing":
        return
    if kind == "directory":
        path.mkdir()
        return
    cut = len(valid) // 2
    if valid[cut - 1 : cut] == b"\n":  # a cut between two text lines is a valid shorter file
        cut -= 3
    content = {
        "empty": b"",
        "truncated": valid[:cut],
        "binary": np.random.default_rng(7).bytes(4096),
        "other_kind": other,
        "out_of_range": out_of_range,
    }[kind]
    path.write_bytes(content)


# ---------------------------------------------------------------------------- the targets
# Each target writes its damaged file under tmp and returns (argv, the file to be named,
# paths that must not exist afterwards: nothing is written half-way).
Target = Callable[[Workspace, Path, str], tuple[list[str], Path, list[Path]]]


def _train_args(tmp: Path, **files: Path) -> list[str]:
    args = ["train", "--set", f"train.out_dir={tmp / 'out'}"]
    for s in TINY:
        args += ["--set", s]
    for key, value in files.items():
        args += ["--set", f"data.{key}={value}"]
    return args


def _train_tsv(ws: Workspace, tmp: Path, kind: str, *, gz: bool = False, eval_file: bool = False):
    good = tmp / "good.tsv"
    good.write_text(ws.tsv)
    valid = ws.tsv.encode()
    bad_rows = valid.replace(b"\n0\t", b"\n7\t", 1).replace(b"\n1\t", b"\n7\t", 1)
    if gz:
        valid, bad_rows = gzip.compress(valid, mtime=0), gzip.compress(bad_rows, mtime=0)
    bad = tmp / ("bad.tsv.gz" if gz else "bad.tsv")
    _damage(bad, kind, valid, b"\x89PNG\r\n\x1a\n" + b"\0" * 64, bad_rows)
    train_file, eval_path = (good, bad) if eval_file else (bad, good)
    args = _train_args(tmp, source="criteo_tsv", path=train_file, eval_path=eval_path)
    return [*args, "--set", "data.eval_rows=0"], bad, [tmp / "out"]


def _train_parquet(ws: Workspace, tmp: Path, kind: str):
    good, scratch = tmp / "good.parquet", tmp / "scratch.parquet"
    _parquet(good, ws.tsv)
    _parquet(scratch, ws.tsv, label=3)
    bad = tmp / "bad.parquet"
    _damage(bad, kind, good.read_bytes(), ws.tsv.encode(), scratch.read_bytes())
    args = _train_args(tmp, source="parquet", path=bad, eval_path=good)
    return [*args, "--set", "data.eval_rows=0"], bad, [tmp / "out"]


def _train_config(ws: Workspace, tmp: Path, kind: str):
    bad = tmp / "job.toml"
    valid = b"[train]\nsteps = 2\n[optim]\nembedding_lr = 0.1\n"
    _damage(bad, kind, valid, b'{"train": {"steps": 2}}', b"[optim]\nembedding_lr = inf\n")
    return [*_train_args(tmp), "--config", str(bad)], bad, [tmp / "out"]


def _checkpoint_file(ws: Workspace, tmp: Path, kind: str) -> tuple[Path, Path]:
    """A copy of the run whose newest checkpoint is damaged."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    from embcore.train.run_state import latest_checkpoint

    run = ws.copy_run(tmp / "run")
    newest = latest_checkpoint(run / "checkpoints")
    assert newest is not None and newest.is_file()
    valid = newest.read_bytes()
    with safe_open(os.fspath(newest), "pt") as f:
        tensors = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118
        meta = json.loads(f.metadata()["embcore"])
    meta["config"]["data"]["batch_size"] = -5
    scratch = tmp / "scratch.safetensors"
    save_file(tensors, scratch, metadata={"embcore": json.dumps(meta)})
    newest.unlink()
    _damage(newest, kind, valid, b'{"step": 2}', scratch.read_bytes())
    return run, newest


def _resume(ws: Workspace, tmp: Path, kind: str):
    run, bad = _checkpoint_file(ws, tmp, kind)
    before = sorted(p.name for p in run.rglob("*"))
    args = [*_train_args(tmp), "--set", f"train.out_dir={run}", "--resume"]
    return args, bad, [run / "summary.json"] if "summary.json" not in before else []


def _export(ws: Workspace, tmp: Path, kind: str):
    run, bad = _checkpoint_file(ws, tmp, kind)
    out = tmp / "bundle"
    return ["export", "--run", str(run), "--checkpoint", str(bad), "--out", str(out)], bad, [out]


def _bundle_file(name: str) -> Target:
    def target(ws: Workspace, tmp: Path, kind: str):
        bundle = tmp / "bundle"
        shutil.copytree(ws.bundle, bundle)
        bad = bundle / name
        valid = bad.read_bytes()
        bad.unlink()
        if name.endswith(".json"):
            manifest = json.loads(valid)
            manifest["config"]["model"]["embedding_dim"] = 0
            other, out_of_range = (bundle / "dense.safetensors").read_bytes(), manifest
        else:
            from safetensors.numpy import save

            other = (bundle / "config.json").read_bytes()
            out_of_range = save({"C1": np.zeros((3, 3), np.float32)})
        if isinstance(out_of_range, dict):
            out_of_range = json.dumps(out_of_range).encode()
        _damage(bad, kind, valid, other, out_of_range)
        scores = tmp / "scores.npy"
        return ["predict", "--bundle", str(bundle), "--output", str(scores)], bad, [scores]

    return target


def _predict_input(suffix: str) -> Target:
    def target(ws: Workspace, tmp: Path, kind: str):
        bad = tmp / f"rows{suffix}"
        if suffix == ".parquet":
            _parquet(tmp / "good.parquet", ws.tsv)
            _parquet(tmp / "scratch.parquet", ws.tsv, label=5)
            valid = (tmp / "good.parquet").read_bytes()
            other, out_of_range = ws.tsv.encode(), (tmp / "scratch.parquet").read_bytes()
        else:
            valid = ws.tsv.encode()
            other = b"\x89PNG\r\n\x1a\n" + b"\0" * 64
            out_of_range = valid.replace(b"\t", b"\tzz", 1)
        _damage(bad, kind, valid, other, out_of_range)
        scores = tmp / "scores.csv"
        args = ["predict", "--bundle", str(ws.bundle), "--input", str(bad), "--output", str(scores)]
        return args, bad, [scores]

    return target


def _plan_config(ws: Workspace, tmp: Path, kind: str):
    bad = tmp / "tables.json"
    valid = json.dumps({"tables": [{"name": "user", "vocabulary_size": 500, "dim": 8}]}).encode()
    out_of_range = json.dumps({"tables": [{"name": "user", "vocabulary_size": 500, "dim": 0}]})
    _damage(bad, kind, valid, b"[train]\nsteps = 3\n", out_of_range.encode())
    out = tmp / "plan.json"
    return ["plan", "--config", str(bad), "-w", "2", "--output", str(out)], bad, [out]


def _plan_stats(ws: Workspace, tmp: Path, kind: str):
    config = tmp / "tables.json"
    config.write_text(json.dumps({"tables": [{"name": "user", "vocabulary_size": 500, "dim": 8}]}))
    bad = tmp / "stats.json"
    valid = json.dumps({"user": {"ids_per_example": 3, "unique_ratio": 0.5}}).encode()
    out_of_range = json.dumps({"user": {"ids_per_example": -3, "unique_ratio": 7}}).encode()
    _damage(bad, kind, valid, b"\x89PNG\r\n\x1a\n", out_of_range)
    out = tmp / "plan.json"
    args = ["plan", "--config", str(config), "-w", "2", "--stats", str(bad), "--output", str(out)]
    return args, bad, [out]


def _stats_file(ws: Workspace, tmp: Path, kind: str):
    import embcore as ec

    directory = tmp / "profile"
    table = ec.TableConfig(vocabulary_size=20, dim=2, name="video")
    engine = ec.EmbeddingEngine(
        {"f": ec.FeatureConfig(table=table)},
        optimizer=ec.SGD(),
        profile_data_directory=str(directory),
        profile_sample_rate=1.0,
    )
    engine.enqueue({"f": torch.tensor([3, 3, 1])}, training=False)
    engine.dequeue()
    (written,) = engine.write_statistics()
    bad = Path(written)
    valid = bad.read_bytes()
    out_of_range = json.loads(valid)
    out_of_range["batches"] = -4
    bad.unlink()
    _damage(bad, kind, valid, b"[train]\nsteps = 1\n", json.dumps(out_of_range).encode())
    plots = tmp / "plots"
    return ["stats", str(directory), "--plots", str(plots)], bad, [plots]


TARGETS: dict[str, Target] = {
    "train-config-toml": _train_config,
    "train-data-tsv": _train_tsv,
    "train-eval-tsv": lambda ws, tmp, kind: _train_tsv(ws, tmp, kind, eval_file=True),
    "train-data-gzip": lambda ws, tmp, kind: _train_tsv(ws, tmp, kind, gz=True),
    "train-data-parquet": _train_parquet,
    "train-resume-checkpoint": _resume,
    "export-checkpoint": _export,
    "predict-bundle-json": _bundle_file("config.json"),
    "predict-bundle-tables": _bundle_file("tables.safetensors"),
    "predict-bundle-dense": _bundle_file("dense.safetensors"),
    "predict-input-tsv": _predict_input(".tsv"),
    "predict-input-parquet": _predict_input(".parquet"),
    "plan-config-json": _plan_config,
    "plan-stats-json": _plan_stats,
    "stats-json": _stats_file,
}


# --resume with its newest checkpoint missing resumes from the one before or, with none,
# starts at step 0 as documented; a profile directory without statistics files is reported as
# such: neither is a damaged file.
NOT_DAMAGE = {("train-resume-checkpoint", "missing"), ("stats-json", "missing")}
CASES = [(t, k) for t in sorted(TARGETS) for k in KINDS if (t, k) not in NOT_DAMAGE]


@pytest.mark.parametrize("target, kind", CASES)
def test_a_damaged_file_is_one_line_naming_it(
    ws: Workspace, tmp_path: Path, capsys: pytest.CaptureFixture[str], target: str, kind: str
) -> None:
    args, bad, absent = TARGETS[target](ws, tmp_path, kind)
    capsys.readouterr()
    code = main(args)
    err = capsys.readouterr().err
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"embcore {args[0]}: error: "), err
    assert str(bad) in err, err
    for path in absent:
        assert not path.exists() or not any(path.rglob("*")), f"{path} was written"


@pytest.mark.parametrize(
    "target, kind",
    [
        ("train-data-gzip", "truncated"),
        ("export-checkpoint", "binary"),
        ("predict-bundle-json", "out_of_range"),
        ("plan-config-json", "other_kind"),
    ],
)
def test_the_real_entry_point_prints_no_traceback(
    ws: Workspace, tmp_path: Path, target: str, kind: str
) -> None:
    args, bad, _ = TARGETS[target](ws, tmp_path, kind)
    done = subprocess.run(
        [sys.executable, "-m", "embcore.cli.main", *args], capture_output=True, text=True
    )
    assert done.returncode == 2, done.stderr
    assert str(bad) in done.stderr and "Traceback" not in done.stderr, done.stderr
