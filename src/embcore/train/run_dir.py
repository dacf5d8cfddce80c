"""A run's output directory: never start over an earlier run by accident, never lose it early.

``embcore train`` refuses a ``train.out_dir`` that already holds files unless told what to do
with them (docs/main_job.md, "Reruns"):

* ``--resume``: continue from the newest checkpoint in ``out_dir/checkpoints``;
* ``--overwrite``: start at step 0 and replace the earlier run, whose checkpoints are moved
  aside to ``out_dir/checkpoints.replaced`` (a rename, nothing is deleted) and deleted only
  once the new run has published its own first checkpoint. A new run that stops before that
  (Ctrl-C, a crash) leaves the earlier run there, and ``--resume`` continues it: its
  checkpoints move back to ``out_dir/checkpoints``.

Every message about an earlier run (the refusal, Ctrl-C, ``--resume``) says where its
checkpoints are and which flag does what with them.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path

from embcore.errors import UserError
from embcore.train.run_state import latest_checkpoint, list_checkpoints

__all__ = ["RunDirectory"]

#: What a finished run writes beside its checkpoints; replaced together with them.
OUTPUTS = ("summary.json", "history.json", "curves.png")
#: the disk tables' working files (``model.storage="disk"``), under ``out_dir``
ROWS = "rows"


class RunDirectory:
    """The policy for one run's ``out_dir``.

    Args:
        out_dir: the run's ``train.out_dir``.
        resume: continue the run there.
        overwrite: replace the run there.
    """

    def __init__(self, out_dir: str | os.PathLike, *, resume: bool, overwrite: bool) -> None:
        if resume and overwrite:
            raise UserError("give --resume or --overwrite, not both")
        self.root = Path(out_dir)
        self.checkpoints = self.root / "checkpoints"
        self.replaced = self.root / "checkpoints.replaced"
        self.resume, self.overwrite = resume, overwrite
        self._pending: list[Path] = []  # the earlier run's files, deleted on the first publish

    def _holds_files(self) -> bool:
        if self.root.exists() and not self.root.is_dir():
            raise UserError(f"[train] out_dir: {self.root} is a file, expected a directory")
        return self.root.is_dir() and any(p.is_file() for p in self._files())

    def _files(self) -> list[Path]:
        """The run's files, without the disk tables' working files (``rows/``: not outputs,
        a new engine starts them afresh)."""
        rows = self.root / ROWS
        return sorted(p for p in self.root.rglob("*") if rows not in p.parents)

    def check(self) -> None:
        """Refuse, before anything is read or written, an earlier run nobody said to touch.

        Raises:
            UserError: ``out_dir`` holds files and neither ``resume`` nor ``overwrite`` is
                given (or ``out_dir`` is a file).
        """
        if not self._holds_files() or self.resume or self.overwrite:
            return
        found = latest_checkpoint(self.checkpoints)
        if found is not None:
            what = f"{len(list_checkpoints(self.checkpoints))} checkpoint(s), the newest {found}"
        elif (kept := self.kept_run()) is not None:
            what = (
                f"the run an interrupted --overwrite was replacing (kept in {self.replaced}, "
                f"newest {kept.name})"
            )
        else:
            first = next(p for p in self._files() if p.is_file())
            what = f"files ({first.relative_to(self.root)}, ...)"
        raise UserError(
            f"[train] out_dir {self.root} already holds {what}; continue that run with "
            "--resume, replace it with --overwrite, or choose another --set train.out_dir="
        )

    def kept_run(self) -> Path | None:
        """The newest checkpoint of a run that an unfinished ``--overwrite`` set aside, if
        this directory has no checkpoint of its own (else ``None``)."""
        if latest_checkpoint(self.checkpoints) is not None:
            return None
        return latest_checkpoint(self.replaced)

    def open(self, echo: Callable[[str], None]) -> Path | None:
        """Apply the policy once the run's inputs are checked; the checkpoint to resume from.

        Raises:
            UserError: as :meth:`check`.
        """
        self.check()
        found = latest_checkpoint(self.checkpoints)
        if self.resume:
            if found is None and self.kept_run() is not None:
                # An --overwrite stopped before its first checkpoint: continue the run it was
                # replacing (leftovers in checkpoints/ are torn temporary files, never a
                # complete checkpoint).
                if self.checkpoints.exists():
                    shutil.rmtree(self.checkpoints)
                os.replace(self.replaced, self.checkpoints)
                found = latest_checkpoint(self.checkpoints)
                echo(
                    f"--resume: continuing the run an interrupted --overwrite had set aside "
                    f"(moved back from {self.replaced} to {self.checkpoints})"
                )
            elif found is None:
                echo(f"--resume: no checkpoint in {self.checkpoints}, starting at step 0")
            return found
        if self.overwrite and self._holds_files():
            if found is not None:
                # Checkpoints in checkpoints/ supersede any older replaced run: that older run
                # was replaced by this one, which published.
                if self.replaced.exists():
                    shutil.rmtree(self.replaced)
                os.replace(self.checkpoints, self.replaced)
                echo(
                    f"--overwrite: the earlier run's checkpoints moved to {self.replaced}; they "
                    "are deleted once this run writes its first checkpoint"
                )
            self._pending = [self.replaced, *(self.root / name for name in OUTPUTS)]
        return None

    def published(self) -> None:
        """This run has published a checkpoint: the replaced run's files may go now."""
        for path in self._pending:
            if path.is_dir():
                shutil.rmtree(path)
            else:
                path.unlink(missing_ok=True)
        self._pending = []
