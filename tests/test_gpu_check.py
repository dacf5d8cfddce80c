"""scripts/gpu_check.sh's dry run: every step of the GPU check on the CPU (tiny sizes, the
Triton backend in its interpreter), so the script cannot rot between runs on a GPU machine."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "gpu_check.sh"

pytestmark = pytest.mark.slow


def _run(*args: str, timeout: int = 900) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHON": sys.executable}
    env.pop("EMBCORE_TEST_DEVICE", None)
    return subprocess.run(
        ["bash", str(SCRIPT), *args], env=env, capture_output=True, text=True, timeout=timeout
    )


def test_usage_error_exits_2() -> None:
    done = _run()
    assert done.returncode == 2
    assert "usage: bash scripts/gpu_check.sh [--dry-run] OUT_DIR" in done.stderr


def test_dry_run_writes_every_step_within_the_device_limits(tmp_path: Path) -> None:
    out = tmp_path / "out"
    done = _run("--dry-run", str(out))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    files = [p for p in out.rglob("*") if p.is_file()]
    # what the device tool brings back: at most 8 files, under 16 MiB, 2 folders deep
    assert len(files) <= 8, files
    assert all(p.stat().st_size < 16 * 2**20 for p in files)
    assert all(len(p.relative_to(out).parts) <= 3 for p in files)
    summary = (out / "summary.md").read_text()
    for step in ("tests: engine on the device: ok", "tests: kernel sweeps (collected only): ok",
                 "bench: embcore bench --gpu-mode --device cpu --quick: ok"):  # fmt: skip
        assert step in summary, summary
    assert "torch 2." in (out / "versions.txt").read_text()
    tests = (out / "tests.txt").read_text()
    assert " passed" in tests and "failed" not in tests, tests
    assert "tests collected" in tests, tests
    bench = (out / "bench" / "results.md").read_text()
    for row in ("| W1-gpu-quick | embcore |", "| W2-gpu-quick | plain PyTorch (Adagrad) |",
                "| W3-gpu-quick | embcore fixed (W1-gpu-quick) |", "optimizer rowwise_adagrad",
                "optimizer adagrad", "| W2-gpu-quick | update (triton) |"):  # fmt: skip
        assert row in bench, bench
