"""``embcore train`` end to end (tiny), and a run killed by SIGKILL then resumed."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from embcore.cli.main import main
from embcore.train.config import load_config
from embcore.train.loop import train


def test_train_command_writes_progress_summary_and_curves(
    tmp_path: Path, capsys, tiny_sets: list[str]
) -> None:
    config = tmp_path / "job.toml"
    config.write_text("[train]\nsteps = 8\neval_every = 4\nprogress = true\nplot = true\n")
    sets = [
        s for s in tiny_sets if not s.startswith(("train.steps", "train.progress", "train.plot"))
    ]
    args = ["train", "--config", str(config), "--set", f"train.out_dir={tmp_path / 'run'}"]
    for s in sets:
        args += ["--set", s]
    assert main(args) == 0
    captured = capsys.readouterr()
    assert "samples/s" in captured.err  # the tqdm bar: throughput and loss
    assert "loss" in captured.err
    assert "best reachable AUC" in captured.out and "eval AUC" in captured.out
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["steps"] == 8 and set(summary["final"]) == {"auc", "log_loss"}
    assert (tmp_path / "run" / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bad_set_is_a_usage_error(capsys) -> None:
    assert main(["train", "--set", "train.steps=zero"]) == 2
    assert "[train] steps must be an integer, got 'zero'" in capsys.readouterr().err


def test_sigkill_then_resume_matches_an_uninterrupted_run(
    tmp_path: Path, tiny_sets: list[str]
) -> None:
    sets = [s for s in tiny_sets if not s.startswith(("train.steps", "train.checkpoint_every"))]
    sets += ["train.steps=100", "train.eval_every=50", "train.checkpoint_every=5"]
    run = tmp_path / "killed"
    cmd = [sys.executable, "-m", "embcore.cli.main", "train"]
    for s in [*sets, f"train.out_dir={run}"]:
        cmd += ["--set", s]
    env = {**os.environ, "PYTHONWARNINGS": "error"}
    log = tmp_path / "stderr.txt"
    with log.open("wb") as stderr:
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=stderr, env=env)
        first = run / "checkpoints" / "step_00000005.safetensors"
        deadline = time.monotonic() + 120
        while not first.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.005)
        if proc.poll() is not None:
            pytest.fail(f"the run ended before it could be killed: {log.read_text()}")
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert proc.returncode == -signal.SIGKILL
    assert not (run / "summary.json").exists()  # it really died mid-way
    resumed = subprocess.run([*cmd, "--resume"], capture_output=True, text=True, env=env)
    assert resumed.returncode == 0, resumed.stderr
    assert "resuming from" in resumed.stdout
    whole = train(
        load_config(None, [*sets, f"train.out_dir={tmp_path / 'whole'}"]), echo=lambda _: None
    )
    summary = json.loads((run / "summary.json").read_text())
    assert summary["final"] == whole.final
    assert 5 <= summary["resumed_from"] < 100
    history = json.loads((run / "history.json").read_text())
    assert history == whole.history


def test_ctrl_c_then_rerun_is_refused_and_resume_continues(
    tmp_path: Path, tiny_sets: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    sets = [s for s in tiny_sets if not s.startswith(("train.steps", "train.checkpoint_every"))]
    sets += ["train.steps=100000", "train.eval_every=100000", "train.checkpoint_every=3"]
    run = tmp_path / "run"
    cmd = [sys.executable, "-m", "embcore.cli.main", "train"]
    for s in [*sets, f"train.out_dir={run}"]:
        cmd += ["--set", s]
    env = {**os.environ, "PYTHONWARNINGS": "error"}
    proc = subprocess.Popen(
        cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env, text=True
    )
    first = run / "checkpoints" / "step_00000003.safetensors"
    deadline = time.monotonic() + 120
    while not first.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.005)
    if proc.poll() is not None:
        pytest.fail(f"the run ended before it could be interrupted: {proc.stderr.read()}")
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "Traceback" not in err
    (line,) = err.strip().splitlines()
    assert line.startswith("embcore train: interrupted at step ") and "--resume" in line, line
    ckpts = sorted(p.name for p in (run / "checkpoints").iterdir())
    # the obvious rerun without --resume is refused, and deletes nothing
    args = cmd[cmd.index("train") :]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "already holds" in err and "--resume" in err, err
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ckpts
    newest = int(ckpts[-1][len("step_") : -len(".safetensors")])
    assert main([*args, "--resume", "--set", f"train.steps={newest + 2}"]) == 0
    assert "resuming from" in capsys.readouterr().out
    assert json.loads((run / "summary.json").read_text())["steps"] == newest + 2
