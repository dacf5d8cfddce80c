"""benchmarks/movielens.py: its plain PyTorch twin is the same model as embcore's DLRM (same
scores at the start and after training steps on the same batches), and the command reports
the four systems; on small MovieLens files made here."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from movielens_files import write_movielens

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import movielens as bench

from embcore.data.movielens import LAYOUT
from embcore.train.config import load_config
from embcore.train.contract import vocab_sizes_for
from embcore.train.model import build_model, dense_optimizer, embedding_optimizer
from embcore.train.movielens_source import MovieLensSource

SMALL = ["data.batch_size=32", "model.embedding_dim=4", "model.bottom_mlp=[8]", "model.top_mlp=[8]"]


def test_the_plain_twin_trains_as_embcore_does(tmp_path: Path) -> None:
    write_movielens(tmp_path, ratings=200)
    cfg = load_config(None, ["data.source=movielens", f"data.path={tmp_path}", *SMALL])
    source = MovieLensSource(cfg.data, keys=False, vocab_sizes=vocab_sizes_for(cfg))
    model = build_model(
        cfg.model,
        source.vocab_sizes,
        optimizer=embedding_optimizer(cfg.optim),
        seed=0,
        layout=LAYOUT,
        pad=0,
    )
    tables = model.engine.embedding_tables
    twin = bench.PlainDLRM(model, [tables[n].detach() for n in LAYOUT.sparse_names])
    adagrad = torch.optim.Adagrad(
        twin.bags.parameters(),
        lr=cfg.optim.embedding_lr,
        initial_accumulator_value=cfg.optim.initial_accumulator,
    )
    adam = torch.optim.Adam([p for n, p in twin.named_parameters() if not n.startswith("bags.")])
    embcore_adam = dense_optimizer(model, cfg.optim)
    for group in (*adam.param_groups, *embcore_adam.param_groups):
        group["lr"] = 1e-3
    batches = source.train_batches(0)
    torch.sparse.check_sparse_tensor_invariants.disable()
    for step in range(4):
        batch = next(batches)
        a, b = model(batch.dense, batch.sparse), twin(batch.dense, batch.sparse)
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5, msg=f"step {step}")
        for out, opts in ((a, [embcore_adam]), (b, [adagrad, adam])):
            loss = F.binary_cross_entropy_with_logits(out, batch.labels)
            for opt in opts:
                opt.zero_grad(set_to_none=True)
            loss.backward()
            for opt in opts:
                opt.step()


@pytest.mark.slow
def test_the_command_reports_four_systems(tmp_path: Path, capsys) -> None:
    write_movielens(tmp_path / "ml", ratings=200)
    out = tmp_path / "results.json"
    code = bench.main(
        [
            str(tmp_path / "ml"),
            "--json",
            str(out),
            *(x for s in [*SMALL, "train.epochs=1"] for x in ("--set", s)),
        ]
    )
    assert code == 0
    table = capsys.readouterr().out.splitlines()
    assert len(table) == 6 and table[2].startswith("| embcore, fixed tables | 0.")
    assert table[5].startswith("| logistic regression (L-BFGS) | 0.")
