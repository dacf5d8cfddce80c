"""The dense learning-rate schedule of the main job, at its boundaries, and in the loop.

``[optim]``: a linear warmup from 0 over ``warmup_steps`` (step 1 already gets
``dense_lr / warmup_steps``, the last warmup step the full rate), then a cosine decay to
``decay_to * dense_lr`` at the last step. The expected values are written out here from that
definition (``OptimConfig``, docs/main_job.md), not taken from the code under test.
"""

from __future__ import annotations

import math

import pytest
import torch

from embcore.train.config import Config, OptimConfig
from embcore.train.loop import train
from embcore.train.model import dense_lr


def expected_rate(peak: float, warmup: int, decay_to: float, step: int, steps: int) -> float:
    """The schedule's definition for a 1-based ``step`` of ``steps``."""
    if step <= warmup:
        return peak * step / warmup
    fraction = (step - warmup) / (steps - warmup)  # 0 just after warmup, 1 at the last step
    return peak * (decay_to + (1 - decay_to) * (1 + math.cos(math.pi * fraction)) / 2)


def test_boundaries_of_the_default_schedule() -> None:
    cfg = OptimConfig(dense_lr=0.01, warmup_steps=50, decay_to=0.1)
    steps = 1000
    assert dense_lr(cfg, 1, steps) == pytest.approx(0.01 / 50)  # not 0: step 1 trains
    assert dense_lr(cfg, 25, steps) == pytest.approx(0.005)
    assert dense_lr(cfg, 49, steps) == pytest.approx(0.01 * 49 / 50)
    assert dense_lr(cfg, 50, steps) == pytest.approx(0.01)  # the end of warmup: the peak
    # one past warmup: the cosine has just started, 1/950 of the way down
    one_past = 0.01 * (0.1 + 0.9 * (1 + math.cos(math.pi / 950)) / 2)
    assert dense_lr(cfg, 51, steps) == pytest.approx(one_past, rel=1e-12)
    assert dense_lr(cfg, 51, steps) < 0.01
    assert dense_lr(cfg, 525, steps) == pytest.approx(0.01 * 0.55)  # halfway: the mean
    assert dense_lr(cfg, 1000, steps) == pytest.approx(0.001)  # the last step: decay_to


@pytest.mark.parametrize(
    ("peak", "warmup", "decay_to", "steps"),
    [
        (0.01, 50, 0.1, 1000),
        (0.3, 1, 0.0, 10),  # one warmup step, decay to zero
        (0.02, 0, 0.5, 7),  # no warmup: step 1 is the first decay step
        (0.05, 3, 1.0, 12),  # decay_to 1: constant after warmup
        (0.04, 4, 0.25, 5),  # a single decay step
    ],
)
def test_every_step_follows_the_definition(
    peak: float, warmup: int, decay_to: float, steps: int
) -> None:
    cfg = OptimConfig(dense_lr=peak, warmup_steps=warmup, decay_to=decay_to)
    got = [dense_lr(cfg, s, steps) for s in range(1, steps + 1)]
    want = [expected_rate(peak, warmup, decay_to, s, steps) for s in range(1, steps + 1)]
    assert got == pytest.approx(want, rel=1e-12, abs=1e-15)
    assert got[-1] == pytest.approx(peak * decay_to, abs=1e-15)
    assert all(r > 0 for r in got[:-1])  # only a decay to 0 may reach 0, at the very end
    if warmup:
        assert got[warmup - 1] == pytest.approx(peak)
        assert got[:warmup] == sorted(got[:warmup])
    assert got[warmup:] == sorted(got[warmup:], reverse=True)


def _rates_seen_by_adam(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The learning rate of every ``torch.optim.Adam.step`` call, in order."""
    seen: list[float] = []
    step = torch.optim.Adam.step

    def recording_step(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        seen.append(self.param_groups[0]["lr"])
        assert all(g["lr"] == seen[-1] for g in self.param_groups)
        return step(self, *args, **kwargs)

    monkeypatch.setattr(torch.optim.Adam, "step", recording_step)
    return seen


def test_the_training_loop_gives_adam_the_rate_of_each_step(
    tiny: Config, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The tiny job (12 steps, warmup 3): Adam's rate at its n-th step is the schedule's
    value at step n, also after a resume from the checkpoint of step 4."""
    cfg = tiny.with_overrides(["optim.dense_lr=0.02", "optim.decay_to=0.1"])
    steps, warmup = cfg.train.steps, cfg.optim.warmup_steps
    assert (steps, warmup) == (12, 3)
    want = [expected_rate(0.02, warmup, 0.1, s, steps) for s in range(1, steps + 1)]

    seen = _rates_seen_by_adam(monkeypatch)
    train(cfg, echo=lambda _: None)
    assert seen == pytest.approx(want, rel=1e-12)
    assert seen[0] == pytest.approx(0.02 / 3)

    seen.clear()
    train(cfg, stop_at=4, overwrite=True, echo=lambda _: None)
    assert seen == pytest.approx(want[:4], rel=1e-12)
    seen.clear()
    train(cfg, resume=True, echo=lambda _: None)
    assert seen == pytest.approx(want[4:], rel=1e-12)


def test_a_resume_with_more_steps_says_the_schedule_now_ends_later(
    tiny: Config, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The documented choice: the schedule follows the run's current ``train.steps`` (its
    decay ends at the new last step), and the resumed run says so."""
    cfg = tiny.with_overrides(["optim.dense_lr=0.02", "optim.decay_to=0.1"])
    train(cfg, stop_at=4, echo=lambda _: None)
    seen = _rates_seen_by_adam(monkeypatch)
    messages: list[str] = []
    train(cfg.with_overrides(["train.steps=16"]), resume=True, echo=messages.append)
    assert seen == pytest.approx(
        [expected_rate(0.02, 3, 0.1, s, 16) for s in range(5, 17)], rel=1e-12
    )
    (said,) = [m for m in messages if "train.steps" in m]
    assert "train.steps is 16 now, 12 in the checkpoint" in said
    assert "now ends at step 16" in said
    seen.clear()
    messages.clear()
    train(cfg.with_overrides(["train.steps=16"]), resume=True, echo=messages.append)
    assert seen == [] and not [m for m in messages if "train.steps" in m]  # 16 = 16: silent
