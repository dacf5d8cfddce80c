"""Training progress: a redrawn bar on a terminal, one line at a time anywhere else.

When stderr is a terminal, ``embcore train`` shows a tqdm bar (samples/s and the latest loss).
When it is a file or a pipe (a batch job's log, CI), redraws would fill the log with carriage
returns, so it prints a line such as::

    step 200/1,000 (20%)  52,300 samples/s  loss 0.4931

at the first point of the loss curve and then at most every :data:`LINE_SECONDS` seconds, and
at the last step.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import IO, Any

__all__ = ["LINE_SECONDS", "Progress", "progress"]

Echo = Callable[[str], None]

#: Least seconds between two progress lines when output is not a terminal.
LINE_SECONDS = 10.0


class Progress:
    """Progress as lines: ``update`` once per step, ``write`` for other messages."""

    def __init__(
        self, steps: int, step: int, batch_size: int, stream: IO[str], echo: Echo = print
    ) -> None:
        self.steps, self.step, self.batch_size, self.stream = steps, step, batch_size, stream
        self.echo = echo
        self._paused = 0.0
        self._last_line: float | None = None
        self._since, self._samples = time.perf_counter(), 0

    def update(self, samples: int, loss: float | None) -> None:
        """One step of ``samples`` rows; ``loss`` when the step closed a loss-curve point."""
        self.step += 1
        self._samples += samples
        now = time.perf_counter()
        due = self._last_line is None or now - self._last_line >= LINE_SECONDS
        if (loss is not None and due) or self.step == self.steps:
            rate = self._samples / max(now - self._since, 1e-9)
            text = f"step {self.step:,}/{self.steps:,} ({100 * self.step / self.steps:.0f}%)"
            text += f"  {rate:,.0f} samples/s"
            if loss is not None:
                text += f"  loss {loss:.4f}"
            print(text, file=self.stream, flush=True)
            self._last_line, self._since, self._samples = now, now, 0

    def pause(self) -> None:
        """Time from now until :meth:`resume` (evaluation, checkpoints) is not training."""
        self._paused = time.perf_counter()

    def resume(self) -> None:
        self._since += time.perf_counter() - self._paused

    def write(self, text: str) -> None:
        self.echo(text)

    def close(self) -> None:
        pass


class _Bar(Progress):
    """The same on a terminal, as a tqdm bar counting samples (its rate reads samples/s)."""

    def __init__(
        self, steps: int, step: int, batch_size: int, stream: IO[str], echo: Echo = print
    ) -> None:
        from tqdm.auto import tqdm

        super().__init__(steps, step, batch_size, stream, echo)
        self.bar: Any = tqdm(
            total=steps * batch_size,
            initial=step * batch_size,
            unit=" samples",
            unit_scale=True,
            dynamic_ncols=True,
            desc="train",
            file=stream,
        )

    def update(self, samples: int, loss: float | None) -> None:
        if loss is not None:
            self.bar.set_postfix_str(f"loss {loss:.4f}", refresh=False)
        self.bar.update(samples)

    def pause(self) -> None:
        pass

    def resume(self) -> None:
        pass

    def write(self, text: str) -> None:
        self.bar.write(text)

    def close(self) -> None:
        self.bar.close()


def progress(
    enabled: bool,
    steps: int,
    step: int,
    batch_size: int,
    stream: IO[str] | None = None,
    echo: Echo = print,
) -> Progress | None:
    """A bar when ``stream`` (default stderr) is a terminal, else lines; None if disabled.

    Messages other than progress (:meth:`Progress.write`) go to ``echo``, or above the bar.
    """
    if not enabled:
        return None
    stream = sys.stderr if stream is None else stream
    isatty = getattr(stream, "isatty", None)
    kind = _Bar if isatty is not None and isatty() else Progress
    return kind(steps, step, batch_size, stream, echo)
