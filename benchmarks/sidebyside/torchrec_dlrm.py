"""TorchRec's own DLRM on the CPU, the main job's third system (``embcore bench --mainjob``).

``torchrec.models.dlrm.DLRM`` over a ``FusedEmbeddingBagCollection``: TorchRec's embedding
collection with its optimizer fused into the backward (FBGEMM TBE's ``exact_adagrad`` or
``exact_row_wise_adagrad`` on the CPU), which is what TorchRec's ``DistributedModelParallel``
gives a single CPU process; a plain ``EmbeddingBagCollection`` has dense table gradients,
which no TorchRec user trains.
Same tables (rows, dim), features, bottom and top MLP sizes, Adagrad rate and starting
accumulator, dense Adam and batches as the main job; TorchRec's own interaction (pairwise
dots of the bottom output and every feature, as ``DotInteraction``) and its own initial
dense weights. Inputs are ``KeyedJaggedTensor`` s built ahead (what TorchRec's data loaders
hand over). Optional: skipped, with a notice, where torchrec or fbgemm_gpu does not import.
"""

from __future__ import annotations

import itertools
import time
import warnings
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from embcore.data.batch import SPARSE_NAMES
from embcore.train.model import dense_lr

NAME = "TorchRec DLRM"


def unavailable() -> str | None:
    try:
        with warnings.catch_warnings():  # fbgemm_gpu warns of its own optional parts
            warnings.simplefilter("ignore", DeprecationWarning)
            import fbgemm_gpu.split_table_batched_embeddings_ops_training  # noqa: F401
            import torchrec.models.dlrm
            import torchrec.modules.fused_embedding_modules  # noqa: F401
    except Exception as exc:  # ImportError, or an OSError/RuntimeError from a bad build
        return f"torchrec does not import ({type(exc).__name__}: {exc})".splitlines()[0]
    return None


def build(cfg: Any, source: Any, data: list[Any]) -> Callable[[int], float]:
    """One training step of TorchRec's DLRM on ``data[i % len(data)]``; returns its seconds."""
    from torchrec import EmbeddingBagConfig, KeyedJaggedTensor
    from torchrec.models.dlrm import DLRM
    from torchrec.modules.fused_embedding_modules import FusedEmbeddingBagCollection

    dim = cfg.model.embedding_dim
    tables = [
        EmbeddingBagConfig(name=f"t_{n}", embedding_dim=dim, num_embeddings=v, feature_names=[n])
        for n, v in zip(SPARSE_NAMES, source.vocab_sizes, strict=True)
    ]
    from torchrec.optim import RowWiseAdagrad

    kinds = {"adagrad": torch.optim.Adagrad, "rowwise_adagrad": RowWiseAdagrad}
    bags = FusedEmbeddingBagCollection(
        tables,
        optimizer_type=kinds[cfg.optim.embedding_optimizer],
        optimizer_kwargs={"lr": cfg.optim.embedding_lr, "eps": 1e-8},
        device=torch.device("cpu"),
    )
    with torch.no_grad():
        gen = torch.Generator().manual_seed(0)
        scale = cfg.model.embedding_init
        for lookups in bags._emb_modules:  # one per (dim, pooling) group: FBGEMM TBE inside
            tbe = lookups._emb_module
            for weight in tbe.split_embedding_weights():
                weight.copy_(torch.empty(weight.shape).uniform_(-scale, scale, generator=gen))
            for states in tbe.split_optimizer_states():
                for s in states:
                    s.fill_(cfg.optim.initial_accumulator)
    model = DLRM(
        embedding_bag_collection=bags,
        dense_in_features=data[0].dense.shape[1],
        dense_arch_layer_sizes=[*cfg.model.bottom_mlp, dim],
        over_arch_layer_sizes=[*cfg.model.top_mlp, 1],
    )
    dense = [p for name, p in model.named_parameters() if "embedding_bag_collection" not in name]
    opt = torch.optim.Adam(dense, lr=cfg.optim.dense_lr)
    inputs = []
    for b in data:
        rows, features = b.sparse.shape
        kjt = KeyedJaggedTensor.from_lengths_sync(
            keys=list(SPARSE_NAMES),
            values=b.sparse.t().contiguous().view(-1),
            lengths=torch.ones(rows * features, dtype=torch.int32),
        )
        inputs.append((b.dense, b.labels, kjt))
    model.train()
    counter = itertools.count(1)

    def step(i: int) -> float:
        dense_x, labels, kjt = inputs[i % len(inputs)]
        start = time.perf_counter()
        for group in opt.param_groups:
            group["lr"] = dense_lr(cfg.optim, next(counter), cfg.train.steps)
        loss = F.binary_cross_entropy_with_logits(model(dense_x, kjt).squeeze(1), labels)
        opt.zero_grad(set_to_none=True)
        loss.backward()  # also the tables' Adagrad (FBGEMM, fused)
        opt.step()
        loss.detach().item()
        return time.perf_counter() - start

    return step
