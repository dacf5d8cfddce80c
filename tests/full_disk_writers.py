"""Every writer of embcore against a real full disk or a real file-size limit.

Run as ``python tests/full_disk_writers.py {full|fsize} DIR`` (``tests/test_full_disk.py``
does): ``full``: ``DIR`` is a small file system (a tmpfs of 2 MiB), filled up to 32 KiB before
each writer; ``fsize``: each writer runs under a soft ``RLIMIT_FSIZE`` of 128 KiB with
``SIGXFSZ`` ignored (so a write past it fails with ``EFBIG`` instead of killing the process).
Each writer's outputs are larger than what is left. One JSON line per writer: the exception's
class, errno and message, whether the target was published, and what was left beside it.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import signal
import sys
from collections.abc import Callable
from pathlib import Path

import torch

import embcore as ec
from embcore._atomic import DiskFullError
from embcore.estimator.model_dir import write_directory
from embcore.train.bundle import export_bundle
from embcore.train.config import load_config
from embcore.train.model import build_model
from embcore.train.run_state import save_checkpoint

LEFT = 32 << 10  # bytes left free on the full file system
LIMIT = 128 << 10  # the file-size limit


def _fill(directory: Path, leave: int) -> None:
    """Write a filler file so that ``leave`` bytes stay free on ``directory``'s file system."""
    fs = os.statvfs(directory)
    free = fs.f_bavail * fs.f_frsize
    with open(directory / "filler", "wb") as f:
        f.write(b"\0" * max(free - leave, 0))


def _engine(dynamic: bool) -> ec.EmbeddingEngine:
    vocab = None if dynamic else 2000
    table = ec.TableConfig(vocabulary_size=vocab, dim=64, name="t")
    return ec.EmbeddingEngine(
        {"f": ec.FeatureConfig(table)}, optimizer=ec.Adagrad(learning_rate=0.1), seed=1
    )


def _train(engine: ec.EmbeddingEngine, ids: range) -> None:
    engine({"f": torch.tensor(list(ids))})["f"].sum().backward()


#: the bundle with a program gets room for its tensor files (about 1 MB: the default MLPs),
#: not for its program (1.3 MB): bytes left free, and the file-size limit
PROGRAM_ROOM = {"full": 1100 << 10, "fsize": 600 << 10}


def _nothing() -> None:
    pass


def _writers(root: Path) -> dict[str, tuple[Callable[[], None], Path, Callable[[], None], bool]]:
    """name -> (prepare, target, write, room for the tensor files only): ``prepare`` runs
    with the disk not yet full."""
    fixed, dynamic = _engine(False), _engine(True)
    config = load_config(None, ["data.vocab_cap=300", "model.embedding_dim=16"])
    model = build_model(config.model, [300] * 26, optimizer=None, seed=0)
    tensors = {"w": torch.randn(100_000)}

    def base() -> None:
        _train(dynamic, range(10))
        ec.checkpoint.save(dynamic, root / "base")
        _train(dynamic, range(10, 4000))

    run_ckpt = root / "step-1.safetensors"
    return {
        "checkpoint": (_nothing, root / "ckpt",
                       lambda: ec.checkpoint.save(fixed, root / "ckpt"), False),
        "delta": (base, root / "delta",
                  lambda: ec.checkpoint.save(dynamic, root / "delta", base=root / "base"), False),
        "bundle": (_nothing, root / "bundle",
                   lambda: export_bundle(model, config, root / "bundle"), False),
        "bundle-pt2": (_nothing, root / "pt2",
                       lambda: export_bundle(model, config, root / "pt2", fmt="pt2"), True),
        "run-checkpoint": (_nothing, run_ckpt,
                           lambda: save_checkpoint(run_ckpt, tensors, {"step": 1}), False),
        "estimator": (_nothing, root / "est",
                      lambda: write_directory(root / "est", tensors, {"step": 1}), False),
    }  # fmt: skip


def main(mode: str, root: Path) -> None:
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    hard = resource.getrlimit(resource.RLIMIT_FSIZE)[1]
    for name, (prepare, target, write, program) in _writers(root).items():
        for p in root.iterdir():  # a clean file system for each writer
            shutil.rmtree(p) if p.is_dir() and not p.is_symlink() else p.unlink()
        prepare()
        before = {p.name for p in root.iterdir()}
        if mode == "full":
            _fill(root, PROGRAM_ROOM[mode] if program else LEFT)
        else:
            resource.setrlimit(
                resource.RLIMIT_FSIZE, (PROGRAM_ROOM[mode] if program else LIMIT, hard)
            )
        try:
            write()
            error: BaseException | None = None
        except Exception as caught:
            error = caught
        finally:
            resource.setrlimit(resource.RLIMIT_FSIZE, (hard, hard))
        left = sorted({p.name for p in root.iterdir()} - before - {"filler"})
        print(
            json.dumps(
                {
                    "writer": name,
                    "target": str(target),
                    "error": type(error).__name__ if error else None,
                    "disk_full": isinstance(error, DiskFullError),
                    "errno": getattr(error, "errno", None),
                    "message": str(error),
                    "left": left,
                }
            ),
            flush=True,
        )


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]))
