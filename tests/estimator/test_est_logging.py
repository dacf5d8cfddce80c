"""``Estimator.train`` reports progress as TensorFlow's Estimator does: ``loss = ..., step =
...`` at the first step and every ``log_step_count_steps`` steps, ``global_step/sec`` between,
the checkpoints it saves and the final loss, on the ``embcore.estimator`` logger."""

from __future__ import annotations

import logging
import re

import pytest
import torch
from torch import nn

import embcore.feature_column as fc
from embcore.estimator import Estimator, EstimatorSpec


def _estimator(tmp_path, losses: list[float], **options) -> Estimator:
    column = fc.embedding_column(fc.categorical_column_with_identity("v", 6), 2)
    spec = fc.EmbeddingConfigSpec(
        feature_columns=[column], optimization_parameters=fc.AdagradParameters(0.1)
    )
    head = nn.Linear(2, 1)
    optimizer = torch.optim.SGD(head.parameters(), lr=0.1)

    def model_fn(features, labels, params):
        x = fc.DenseFeatures([column])(features)
        loss = ((params["head"](x).squeeze(1) - labels) ** 2).mean()
        losses.append(float(loss.detach()))
        return EstimatorSpec("train", loss=loss, optimizer=optimizer)

    return Estimator(model_fn, tmp_path, spec, params={"head": head}, **options)


def _batches(n: int):
    g = torch.Generator().manual_seed(0)
    return [
        ({"v": torch.randint(0, 6, (4,), generator=g)}, torch.rand(4, generator=g))
        for _ in range(n)
    ]


def test_train_logs_loss_step_and_rate_like_tensorflow(tmp_path, caplog) -> None:
    losses: list[float] = []
    est = _estimator(tmp_path, losses, log_step_count_steps=2, save_checkpoints_steps=3)
    with caplog.at_level(logging.INFO, logger="embcore.estimator"):
        est.train(lambda: _batches(5))
    lines = [r.getMessage() for r in caplog.records if r.name == "embcore.estimator"]
    steps = [
        (float(m[1]), int(m[2]))
        for m in (re.match(r"loss = (\S+), step = (\d+)", x) for x in lines)
        if m
    ]
    assert [s for _, s in steps] == [1, 2, 4]  # the first step, then every 2
    for value, step in steps:
        assert value == pytest.approx(losses[step - 1], rel=1e-5)
    assert re.search(r"loss = \S+, step = 2 \(\d+\.\d{3} sec\)", "\n".join(lines))
    assert sum(bool(re.fullmatch(r"global_step/sec: [\d.e+-]+", x)) for x in lines) == 2
    assert f"Saving checkpoints for 3 into {tmp_path}." in lines
    assert f"Saving checkpoints for 5 into {tmp_path}." in lines
    assert lines[-1] == f"Loss for final step: {losses[-1]:.6g}."


def test_a_resumed_train_logs_its_first_step_and_none_can_silence_it(tmp_path, caplog) -> None:
    losses: list[float] = []
    _estimator(tmp_path, losses, log_step_count_steps=10).train(lambda: _batches(3))
    with caplog.at_level(logging.INFO, logger="embcore.estimator"):
        _estimator(tmp_path, losses, log_step_count_steps=10).train(lambda: _batches(2))
        first = [r.getMessage() for r in caplog.records]
        caplog.clear()
        _estimator(tmp_path / "quiet", [], log_step_count_steps=None).train(lambda: _batches(2))
    assert any(re.fullmatch(r"loss = \S+, step = 4", m) for m in first), first
    assert not any(
        m.startswith(("loss =", "Loss for")) for m in (r.getMessage() for r in caplog.records)
    )
    with pytest.raises(ValueError, match="log_step_count_steps must be an int >= 1, got 0"):
        _estimator(tmp_path, [], log_step_count_steps=0)
