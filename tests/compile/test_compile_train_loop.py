"""``embcore train --set train.compile=true``: the compiled job records the eager job's losses
(float32 rounding aside) and says how long its first, compiling, step took."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch._dynamo

from embcore.train.config import load_config
from embcore.train.loop import train

TINY = [
    "data.vocab_cap=300",
    "data.batch_size=64",
    "data.eval_rows=512",
    "model.embedding_dim=4",
    "model.bottom_mlp=[8]",
    "model.top_mlp=[16]",
    "optim.warmup_steps=2",
    "train.steps=4",
    "train.eval_every=4",
    "train.log_every=1",
    "train.checkpoint_every=4",
    "train.progress=false",
    "train.plot=false",
]


@pytest.mark.slow
def test_the_compiled_job_records_the_eager_losses(tmp_path: Path) -> None:
    torch._dynamo.reset()
    runs, messages = {}, []
    for compiled in (False, True):
        cfg = load_config(
            None,
            [
                *TINY,
                f"train.compile={str(compiled).lower()}",
                f"train.out_dir={tmp_path}/{compiled}",
            ],
        )
        runs[compiled] = train(cfg, echo=messages.append)
    eager, done = runs[False].history, runs[True].history
    assert [s for s, _ in done["loss"]] == [1, 2, 3, 4]
    torch.testing.assert_close(  # Inductor may sum the dense layers in another order
        torch.tensor([v for _, v in done["loss"]]),
        torch.tensor([v for _, v in eager["loss"]]),
        rtol=1e-5,
        atol=1e-6,
    )
    assert done["eval"][-1]["auc"] == pytest.approx(eager["eval"][-1]["auc"], abs=1e-4)
    assert sum(m.startswith("torch.compile: the first step") for m in messages) == 1
