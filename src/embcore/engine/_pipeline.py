"""Pipelined training: step N's update is applied after step N+1's lookup.

With ``pipeline=True`` the engine hands each step's checked update to an
:class:`UpdatePipeline`, which keeps it until the next lookup has read the tables (so that
lookup does not see it: one step stale, docs/semantics.md §4.5). Where the store allows it (a
local store on the CPU, whose kernels release the GIL), the update then runs on a background
thread while the caller computes on the new activations. See docs/architecture.md.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

__all__ = ["UpdatePipeline", "pipelining"]

#: The thread that applies pipelined updates on the CPU (one for every engine: updates from
#: several engines run one after another, each still overlapping its own engine's next step).
#: Its kernels use as many workers as the caller's (``torch.get_num_threads()``): a smaller
#: budget (``embcore._numba.threads.budget``) measured no faster (docs/pipelining_and_stats.md).
_update_thread = ThreadPoolExecutor(1, thread_name_prefix="embcore-update")


class UpdatePipeline:
    """At most one update waiting for the next lookup, and at most one running in the
    background.

    Args:
        apply: applies an update, called with the arguments given to :meth:`defer`.
    """

    def __init__(self) -> None:
        # the update and the function applying it, kept only until they run: a pipeline that
        # held its engine's method for good would tie the two in a reference cycle, keeping a
        # dropped engine's tables in memory until the garbage collector runs
        self.deferred: tuple[Callable[..., None], tuple[Any, ...]] | None = None
        self._inflight: Future | None = None

    def defer(self, apply: Callable[..., None], *update: Any) -> None:
        """Keep ``apply(*update)`` until after the next lookup (two updates in a row: the
        first is applied now)."""
        if self.deferred is not None:
            self.flush()
        self.deferred = (apply, update)

    def after_lookup(self, background: bool) -> None:
        """A lookup has read the tables: apply the deferred update, on the update thread when
        ``background`` (its error surfaces at the next :meth:`wait`)."""
        if self.deferred is not None and background:
            (apply, update), self.deferred = self.deferred, None
            self._inflight = _update_thread.submit(apply, *update)
        else:
            self.flush()

    def wait(self) -> None:
        """Join an update running in the background (re-raising its error)."""
        inflight, self._inflight = self._inflight, None
        if inflight is not None:
            inflight.result()

    def flush(self) -> None:
        """Apply the deferred update now, after any background one (no-op without one)."""
        self.wait()
        if self.deferred is not None:
            (apply, update), self.deferred = self.deferred, None
            apply(*update)

    def discard(self) -> None:
        """Drop the deferred update (the tables were replaced: it no longer applies)."""
        self.deferred = None


def pipelining(pipeline: bool | None, pipeline_execution_with_tensor_core: bool | None) -> bool:
    """The engine's one pipelining flag from ``pipeline`` and TF's name for it."""
    if (
        pipeline is not None
        and pipeline_execution_with_tensor_core is not None
        and bool(pipeline) != bool(pipeline_execution_with_tensor_core)
    ):
        raise ValueError(
            f"EmbeddingEngine: pipeline={pipeline!r} and pipeline_execution_with_tensor_core="
            f"{pipeline_execution_with_tensor_core!r} disagree; pass only one of them (the "
            "second is TF's name for the first)"
        )
    chosen = pipeline if pipeline is not None else pipeline_execution_with_tensor_core
    return bool(chosen)
