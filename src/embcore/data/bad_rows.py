"""What a reader does with a malformed row: stop (the default) or skip it and count it.

``data.bad_rows = "raise"`` stops at the first malformed row with its file and line;
``"skip"`` leaves such rows out and counts each distinct one, for the run's report
(docs/main_job.md, "Malformed rows").
"""

from __future__ import annotations

import threading

from embcore.errors import UserError

__all__ = ["BadRows"]


class BadRows:
    """The policy for malformed rows of one file, and the rows it skipped.

    Args:
        skip: skip and count malformed rows instead of raising.

    Attributes:
        first: the message of the first skipped row (``""`` if none).
    """

    def __init__(self, skip: bool = False) -> None:
        self.skip = skip
        self.first = ""
        self._seen: set[int] = set()
        self._lock = threading.Lock()  # readers run in a background thread too

    @property
    def count(self) -> int:
        """Distinct rows skipped (a file read in a loop counts each row once)."""
        return len(self._seen)

    def found(self, row: int, message: str) -> None:
        """Row ``row`` (a line or row number) is malformed: raise, or count it.

        Raises:
            UserError: with ``message``, unless skipping.
        """
        if not self.skip:
            raise UserError(message)
        with self._lock:
            self._seen.add(row)
            if not self.first:
                self.first = message
