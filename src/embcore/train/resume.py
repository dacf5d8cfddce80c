"""What may differ between a checkpoint's config and the config of the run that resumes it.

A resumed run must compute the run it continues: any key that changes the model, the data or
the optimization is refused, naming the checkpoint's value and how to set it back. Allowed:

* ``RESUMABLE_CHANGES``: how long the run goes on and what it shows or keeps. A changed
  ``train.steps`` also moves the end of the dense learning-rate schedule (its cosine decay ends
  at the last step, docs/main_job.md "Reruns"); the resumed run says so.
* ``LOCATION_ONLY``: where the run and its data are. A run reached by a relative path in one
  launch and an absolute one in the next, moved to another disk, or copied to branch from it,
  is the same run. A changed data path is trusted to hold the same rows (the run says so).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from embcore.errors import UserError
from embcore.train.config import LOCATION_ONLY, RESUMABLE_CHANGES, Config

__all__ = ["check_resumable"]


def check_resumable(cfg: Config, saved: Config, path: Path, echo: Callable[[str], None]) -> None:
    """Refuse ``cfg`` if it computes another run than ``saved`` (the checkpoint's config);
    echo what a resume with it changes.

    Raises:
        UserError: a key outside ``RESUMABLE_CHANGES`` and ``LOCATION_ONLY`` differs; the
            message names each key with both values and the ``--set`` that restores them.
    """
    then, now = saved.to_dict(), cfg.to_dict()
    differences = cfg.differences(saved)
    changed = [k for k in differences if k not in RESUMABLE_CHANGES + LOCATION_ONLY]
    if changed:
        sides = "; ".join(f"{k} = {_text(then, k)} there, {_text(now, k)} now" for k in changed)
        back = " ".join(f"--set {k}={_text(then, k)}" for k in changed)
        raise UserError(
            f"--resume: the config differs from checkpoint {path} in {changed} ({sides}); only "
            f"{list(RESUMABLE_CHANGES)} and where files are ({list(LOCATION_ONLY)}) may change "
            f"when resuming: add {back} to resume it, or replace the run with --overwrite"
        )
    for key in ("data.path", "data.eval_path"):
        if key in differences:
            echo(
                f"--resume: {key} is {_text(now, key)} now, {_text(then, key)} in the "
                "checkpoint; resuming on the understanding that it holds the same rows"
            )
    if saved.train.steps != cfg.train.steps:
        echo(
            f"--resume: train.steps is {cfg.train.steps:,} now, {saved.train.steps:,} in the "
            "checkpoint: the dense learning-rate schedule (warmup, then cosine decay to "
            f"optim.decay_to) now ends at step {cfg.train.steps:,}, so the remaining steps get "
            f"the rates of a {cfg.train.steps:,}-step run, not those the checkpoint's run had "
            "planned"
        )


def _text(values: dict[str, dict[str, Any]], key: str) -> str:
    """One config value as ``--set`` reads it back (TOML: ``true``, ``[8, 4]``, ``0.5``)."""
    section, _, name = key.partition(".")
    value = values[section][name]
    if isinstance(value, bool):
        return str(value).lower()
    return repr(value) if isinstance(value, str) and not value else str(value)
