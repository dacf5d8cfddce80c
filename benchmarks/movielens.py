"""MovieLens-100k: embcore's DLRM against the same model in plain PyTorch and logistic regression.

    python benchmarks/movielens.py data/ml-100k [--set train.epochs=10 ...] [--json out.json]

Every system sees the same task (``data.source = "movielens"``: label rating >= 4, the first
80,000 ratings by time train, the last 20,000 evaluate), the same features and, but for the
logistic regression, the same epochs of the same reshuffled batches:

* **embcore, fixed tables** and **embcore, dynamic tables**: ``embcore train`` itself
  (:func:`embcore.train.loop.train`) on the config given (the defaults and ``--set``), the
  second with ``model.tables = "dynamic"`` (raw keys, a row per id).
* **plain PyTorch**: the same DLRM, its tables ``nn.EmbeddingBag(mode="mean", sparse=True)``
  (the genres bag with ``padding_idx=0``) trained by ``torch.optim.Adagrad`` at the same rate
  and starting accumulator, the dense weights by ``torch.optim.Adam`` at the same schedule;
  the tables and dense weights start from the embcore fixed-table model's initial values.
* **logistic regression**: one weight per table row (the ids one-hot, the genres multi-hot)
  and per dense feature, fitted to the whole training set by L-BFGS with an L2 penalty.

Reported: held-out AUC and log loss after the last epoch, and training seconds per epoch
(evaluation excluded; the logistic regression's whole fit).
"""

from __future__ import annotations

import argparse
import copy
import json
import tempfile
import time
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from embcore.data.movielens import LAYOUT
from embcore.train.config import Config, load_config
from embcore.train.contract import vocab_sizes_for
from embcore.train.loop import train
from embcore.train.metrics import auc, log_loss
from embcore.train.model import build_model, dense_lr, embedding_optimizer
from embcore.train.movielens_source import MovieLensSource, epoch_config

Result = dict[str, Any]


def _metrics(labels: np.ndarray, logits: np.ndarray) -> dict[str, float]:
    return {"auc": auc(labels, logits), "log_loss": log_loss(labels, logits)}


def run_embcore(config: Config, tables: str) -> Result:
    """``embcore train`` with ``model.tables = tables``; its final held-out metrics."""
    with tempfile.TemporaryDirectory() as out:
        cfg = config.with_overrides(
            [f"model.tables={tables}", f"train.out_dir={out}", "train.plot=false"]
        )
        result = train(cfg, echo=lambda line: None)
    epochs = len(result.history["eval"])
    return {**result.final, "seconds_per_epoch": result.seconds / epochs, "epochs": epochs}


class PlainDLRM(nn.Module):
    """The DLRM of the run's config with ``nn.EmbeddingBag`` tables (module docstring)."""

    def __init__(self, like: nn.Module, tables: list[Tensor]) -> None:
        super().__init__()
        self.widths = LAYOUT.widths
        self.bags = nn.ModuleList(
            nn.EmbeddingBag.from_pretrained(
                t.clone(), freeze=False, mode="mean", sparse=True, padding_idx=0 if w > 1 else None
            )
            for t, w in zip(tables, self.widths, strict=True)
        )
        self.bottom = copy.deepcopy(like.bottom)
        self.interaction = copy.deepcopy(like.interaction)
        self.top = copy.deepcopy(like.top)
        # the interaction sees the features in the engine's order (sorted names), as embcore's
        self.order = [LAYOUT.sparse_names.index(name) for name in like.engine.feature_names]

    def forward(self, dense: Tensor, sparse: Tensor) -> Tensor:
        x = self.bottom(dense)
        columns = torch.split(sparse, list(self.widths), dim=1)
        emb = [self.bags[f](columns[f]) for f in self.order]
        return self.top(self.interaction(x, torch.stack(emb, 1))).squeeze(1)


def run_plain(config: Config) -> Result:
    """The plain PyTorch twin (module docstring) on the fixed-table run's batches."""
    cfg = config.with_overrides(["model.tables=fixed", "data.raw_ids=false"])
    source = MovieLensSource(cfg.data, keys=False, vocab_sizes=vocab_sizes_for(cfg))
    cfg = epoch_config(cfg, source.steps_per_epoch)
    like = build_model(
        cfg.model,
        source.vocab_sizes,
        optimizer=embedding_optimizer(cfg.optim),
        seed=cfg.train.seed,
        layout=LAYOUT,
        pad=0,
    )
    tables = like.engine.embedding_tables
    model = PlainDLRM(like, [tables[name].detach() for name in LAYOUT.sparse_names])
    sparse_opt = torch.optim.Adagrad(
        model.bags.parameters(),
        lr=cfg.optim.embedding_lr,
        initial_accumulator_value=cfg.optim.initial_accumulator,
    )
    dense_params = [p for n, p in model.named_parameters() if not n.startswith("bags.")]
    dense_opt = torch.optim.Adam(dense_params, lr=cfg.optim.dense_lr)
    torch.sparse.check_sparse_tensor_invariants.disable()  # says so (no warning per step)
    eval_set = source.eval_set()
    labels = eval_set.labels
    seconds, final = 0.0, {}
    batches = source.train_batches(0)
    for step in range(1, cfg.train.steps + 1):
        batch = next(batches)
        start = time.perf_counter()
        for group in dense_opt.param_groups:
            group["lr"] = dense_lr(cfg.optim, step, cfg.train.steps)
        loss = F.binary_cross_entropy_with_logits(model(batch.dense, batch.sparse), batch.labels)
        sparse_opt.zero_grad(set_to_none=True)
        dense_opt.zero_grad(set_to_none=True)
        loss.backward()
        sparse_opt.step()
        dense_opt.step()
        seconds += time.perf_counter() - start
        if step % cfg.train.eval_every == 0:
            model.eval()
            with torch.no_grad():
                logits = [model(b.dense, b.sparse).double().numpy() for b in eval_set.batches]
            model.train()
            final = _metrics(labels, np.concatenate(logits))
    epochs = cfg.train.steps // cfg.train.eval_every
    return {**final, "seconds_per_epoch": seconds / epochs, "epochs": epochs}


def run_logistic(config: Config, l2: float = 1e-4) -> Result:
    """Logistic regression on the same features (module docstring), fitted by L-BFGS."""
    cfg = config.with_overrides(["model.tables=fixed", "data.raw_ids=false"])
    source = MovieLensSource(cfg.data, keys=False, vocab_sizes=vocab_sizes_for(cfg))
    rows = np.arange(source.train_rows)
    train_batch = source._batch(rows)
    offsets = np.concatenate([[0], np.cumsum(source.vocab_sizes)])
    columns = np.repeat(offsets[:-1], LAYOUT.widths)

    def one_hot(sparse: Tensor) -> Tensor:
        # bag padding (row 0 of the genres) is a weight like any other row: constant per movie
        return sparse + torch.from_numpy(columns)

    weights = torch.zeros(int(offsets[-1]), requires_grad=True)
    linear = torch.zeros(len(LAYOUT.dense_names) + 1, requires_grad=True)
    opt = torch.optim.LBFGS([weights, linear], max_iter=200, line_search_fn="strong_wolfe")

    def logits(dense: Tensor, sparse: Tensor) -> Tensor:
        return weights[one_hot(sparse)].sum(1) + dense @ linear[:-1] + linear[-1]

    def closure() -> Tensor:
        opt.zero_grad()
        z = logits(train_batch.dense, train_batch.sparse)
        loss = F.binary_cross_entropy_with_logits(z, train_batch.labels)
        loss = loss + l2 * (weights.square().sum() + linear[:-1].square().sum())
        loss.backward()
        return loss

    start = time.perf_counter()
    opt.step(closure)
    seconds = time.perf_counter() - start
    eval_set = source.eval_set()
    with torch.no_grad():
        z = np.concatenate([logits(b.dense, b.sparse).double().numpy() for b in eval_set.batches])
    return {**_metrics(eval_set.labels, z), "seconds_per_epoch": seconds, "epochs": "L-BFGS"}


def markdown(results: dict[str, Result]) -> str:
    lines = [
        "| model | held-out AUC | held-out log loss | epochs | training s / epoch |",
        "|---|---:|---:|---:|---:|",
    ]
    for name, r in results.items():
        lines.append(
            f"| {name} | {r['auc']:.4f} | {r['log_loss']:.4f} | {r['epochs']} | "
            f"{r['seconds_per_epoch']:.2f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("path", help="a directory in GroupLens' ml-100k layout")
    parser.add_argument("--set", action="append", default=[], dest="overrides")
    parser.add_argument("--json", help="also write the results as JSON")
    args = parser.parse_args(argv)
    overrides = ["data.source=movielens", f"data.path={args.path}", "train.progress=false"]
    config = load_config(None, [*overrides, *args.overrides])
    torch.set_num_threads(config.train.threads or torch.get_num_threads())
    results = {
        "embcore, fixed tables": run_embcore(config, "fixed"),
        "embcore, dynamic tables": run_embcore(config, "dynamic"),
        "plain PyTorch (nn.EmbeddingBag + torch.optim)": run_plain(config),
        "logistic regression (L-BFGS)": run_logistic(config),
    }
    print(markdown(results))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
