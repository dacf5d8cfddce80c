"""A real full disk and a real file-size limit, for every writer (checkpoints, deltas, serving
bundles with and without a program, run checkpoints, Estimator directories): each ends in
:class:`embcore._atomic.DiskFullError` naming what it was writing, publishes nothing and leaves
nothing behind, whatever PyTorch's, DCP's or safetensors' writer raised ("unexpected pos",
``OSError``, a Rust I/O error); and no writer aborts the process (PyTorch's zip writer did,
writing a program to a full disk). The writers run in a subprocess:
``tests/full_disk_writers.py``."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

WRITERS = ["checkpoint", "delta", "bundle", "bundle-pt2", "run-checkpoint", "estimator"]
SCRIPT = Path(__file__).with_name("full_disk_writers.py")


def _run(mode: str, directory: Path) -> list[dict]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run(
        [sys.executable, str(SCRIPT), mode, str(directory)],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    assert done.returncode == 0, done.stderr[-3000:]  # an abort (SIGABRT) ends it early
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


def _check(results: list[dict], code: int, words: str) -> None:
    assert [r["writer"] for r in results] == WRITERS
    for r in results:
        assert r["disk_full"] and r["errno"] == code, r
        assert f"{words} while writing {r['target']}" in r["message"], r
        assert "nothing was published" in r["message"]
        assert r["left"] == [], r  # nothing published, no temporary file or directory left


@pytest.fixture
def small_disk(tmp_path: Path):
    """A 2 MiB tmpfs (mounting one needs root)."""
    disk = tmp_path / "disk"
    disk.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root; the file-size-limit test covers the writers")
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(disk)], capture_output=True
    )
    if mounted.returncode != 0:
        pytest.skip(f"mount -t tmpfs was refused here: {mounted.stderr.decode().strip()}")
    yield disk
    subprocess.run(["umount", str(disk)], check=True)


@pytest.mark.slow
def test_every_writer_on_a_real_full_disk(small_disk: Path) -> None:
    _check(_run("full", small_disk), errno.ENOSPC, "no space left on the device")


@pytest.mark.slow
def test_every_writer_at_the_file_size_limit(tmp_path: Path) -> None:
    _check(_run("fsize", tmp_path), errno.EFBIG, "file-size limit (ulimit -f)")
