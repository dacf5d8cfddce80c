"""The main job (``embcore train`` on its defaults) against the same DLRM in plain PyTorch.

Both systems train the DLRM of the default config (``embcore.train.model.build_model``: the
bottom MLP, the dot interaction, the top MLP, same seed, same dense initial weights) on the
same batches of the built-in synthetic source, stepping as the job's loop does: forward, mean
binary cross-entropy, backward, a dense Adam step at the loop's learning-rate schedule.

* **embcore**: the job's own model, whose engine updates the tables (Adagrad) inside
  ``loss.backward()``, and its dense optimizer (``dense_optimizer``: Adam's fused kernel);
  inputs prepared ahead with ``engine.prepare`` (the loop does that in its ``Prefetcher``
  thread).
* **plain PyTorch**: one ``nn.EmbeddingBag(mode="sum", sparse=True)`` per feature with
  ``torch.optim.Adagrad`` (same rate and starting accumulator), ``torch.optim.Adam`` for the
  dense part; per-feature ids and offsets split out ahead (what a data loader would do).

Interleaved: every repeat runs each system for ``steps`` timed steps in turn (A B, A B, ...);
reported per system are min / median / max of the per-repeat medians, and the speed-up is
taken within each repeat (peer median over embcore median of the same repeat).
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from embcore.train.config import Config
from embcore.train.model import build_model, dense_lr, dense_optimizer, embedding_optimizer
from embcore.train.sources import build_source

__all__ = ["MainJobOptions", "embcore_step", "markdown", "run"]

Step = Callable[[int], float]


@dataclass
class MainJobOptions:
    """What to run: ``overrides`` are ``section.key=value`` config settings (as ``--set``)."""

    repeats: int = 3
    warmup: int = 3
    steps: int = 20
    batches: int = 8
    overrides: list[str] = field(default_factory=list)


class PlainDLRM(nn.Module):
    """The same DLRM with ``nn.EmbeddingBag(sparse=True)`` tables: its bottom MLP,
    interaction and top MLP are the embcore model's modules' deep copies (same weights)."""

    def __init__(self, like: nn.Module, vocab_sizes: list[int], dim: int, scale: float) -> None:
        super().__init__()
        import copy

        self.bags = nn.ModuleList(
            nn.EmbeddingBag(v, dim, mode="sum", sparse=True) for v in vocab_sizes
        )
        gen = torch.Generator().manual_seed(0)
        with torch.no_grad():
            for bag in self.bags:
                bag.weight.uniform_(-scale, scale, generator=gen)
        self.bottom = copy.deepcopy(like.bottom)
        self.interaction = copy.deepcopy(like.interaction)
        self.top = copy.deepcopy(like.top)

    def forward(self, dense: Tensor, sparse: list[tuple[Tensor, Tensor]]) -> Tensor:
        x = self.bottom(dense)
        emb = torch.stack([bag(v, o) for bag, (v, o) in zip(self.bags, sparse, strict=True)], 1)
        return self.top(self.interaction(x, emb)).squeeze(1)

    def dense_parameters(self) -> list[Tensor]:
        return [p for name, p in self.named_parameters() if not name.startswith("bags.")]


def _embcore(cfg: Config, source: Any, data: list[Any]) -> Step:
    model = build_model(
        cfg.model,
        source.vocab_sizes,
        optimizer=embedding_optimizer(cfg.optim),
        seed=cfg.train.seed,
        engine_options={"pipeline": cfg.train.pipeline},
    )
    opt = dense_optimizer(model, cfg.optim)  # as embcore train
    inputs = [(b.dense, b.labels, model.engine.prepare(model.features(b.sparse))) for b in data]
    model.train()
    counter = itertools.count(1)

    def step(i: int) -> float:
        dense, labels, prepared = inputs[i % len(inputs)]
        start = time.perf_counter()
        for group in opt.param_groups:
            group["lr"] = dense_lr(cfg.optim, next(counter), cfg.train.steps)
        loss = F.binary_cross_entropy_with_logits(model(dense, prepared), labels)
        opt.zero_grad(set_to_none=True)
        loss.backward()  # also the engine's update
        opt.step()
        loss.detach().item()
        return time.perf_counter() - start

    step.model = model  # type: ignore[attr-defined]
    return step


def _plain(cfg: Config, source: Any, data: list[Any], like: nn.Module) -> Step:
    if cfg.optim.embedding_optimizer != "adagrad":
        raise ValueError(
            "embcore bench --mainjob: the plain PyTorch peer runs Adagrad; got "
            f"optim.embedding_optimizer={cfg.optim.embedding_optimizer!r}"
        )
    torch.sparse.check_sparse_tensor_invariants.disable()
    dim = cfg.model.embedding_dim
    model = PlainDLRM(like, list(source.vocab_sizes), dim, cfg.model.embedding_init)
    tables = torch.optim.Adagrad(
        model.bags.parameters(),
        lr=cfg.optim.embedding_lr,
        initial_accumulator_value=cfg.optim.initial_accumulator,
    )
    opt = torch.optim.Adam(model.dense_parameters(), lr=cfg.optim.dense_lr)
    inputs = []
    for b in data:
        rows = b.sparse.shape[0]
        offsets = torch.arange(rows, dtype=torch.int64)
        columns = [(b.sparse[:, f].contiguous(), offsets) for f in range(b.sparse.shape[1])]
        inputs.append((b.dense, b.labels, columns))
    model.train()
    counter = itertools.count(1)

    def step(i: int) -> float:
        dense, labels, columns = inputs[i % len(inputs)]
        start = time.perf_counter()
        for group in opt.param_groups:
            group["lr"] = dense_lr(cfg.optim, next(counter), cfg.train.steps)
        loss = F.binary_cross_entropy_with_logits(model(dense, columns), labels)
        opt.zero_grad(set_to_none=True)
        tables.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        tables.step()
        loss.detach().item()
        return time.perf_counter() - start

    return step


def embcore_step(overrides: list[str], batches: int) -> tuple[Step, Config]:
    """The main job's embcore step alone (for profiling; sets the config's thread count)."""
    cfg = Config().with_overrides(overrides)
    torch.set_num_threads(cfg.train.threads or torch.get_num_threads())
    source = build_source(cfg.data)
    data = list(itertools.islice(source.train_batches(0), batches))
    return _embcore(cfg, source, data), cfg


def run(options: MainJobOptions, log: Callable[[str], None] = print) -> dict:
    """Per system and repeat, the step times; plus the config they ran."""
    cfg = Config().with_overrides(options.overrides)
    threads = torch.get_num_threads()
    torch.set_num_threads(cfg.train.threads or threads)
    try:
        source = build_source(cfg.data)
        data = list(itertools.islice(source.train_batches(0), options.batches))
        ours = _embcore(cfg, source, data)
        systems = {"embcore": ours, "plain PyTorch": _plain(cfg, source, data, ours.model)}  # type: ignore[attr-defined]
        times: dict[str, list[list[float]]] = {name: [] for name in systems}
        i = 0
        for step in systems.values():
            for _ in range(options.warmup):
                step(i)
                i += 1
        for repeat in range(options.repeats):
            for name, step in systems.items():  # interleaved: A B, A B, ...
                times[name].append([step(i + k) for k in range(options.steps)])
                log(
                    f"[main job, repeat {repeat + 1}] {name}: "
                    f"{1e3 * float(np.median(times[name][-1])):.1f} ms/step"
                )
            i += options.steps
        torch_threads = torch.get_num_threads()
    finally:
        torch.set_num_threads(threads)
    return {
        "options": asdict(options),
        "batch_size": cfg.data.batch_size,
        "threads": torch_threads,
        "config": {"model": asdict(cfg.model), "optim": asdict(cfg.optim)},
        "step_s": times,
    }


def summarize(results: dict) -> dict:
    """Per system min / median / max (ms) of the per-repeat medians; the speed-ups of the
    peer over embcore within each repeat, and their median."""
    medians = {
        name: [1e3 * float(np.median(r)) for r in runs] for name, runs in results["step_s"].items()
    }
    rows = {
        name: {"min": min(m), "median": float(np.median(m)), "max": max(m), "runs": m}
        for name, m in medians.items()
    }
    ratios = [p / e for p, e in zip(medians["plain PyTorch"], medians["embcore"], strict=True)]
    return {"systems": rows, "speedups": ratios, "speedup": float(np.median(ratios))}


def markdown(results: dict) -> str:
    """The main job table: ms/step and samples/s per system, and the speed-up."""
    s = summarize(results)
    batch = results["batch_size"]
    o = results["options"]
    lines = [
        f"Main job (`embcore train` defaults: batch {batch}, {results['threads']} torch "
        f"thread(s)); {o['repeats']} interleaved repeats of {o['steps']} timed steps per "
        "system; min / median / max of the per-repeat medians.",
        "",
        "| system | min ms/step | median ms/step | max ms/step | samples/s (median) | runs |",
        "|---|---:|---:|---:|---:|---|",
    ]
    for name, r in s["systems"].items():
        lines.append(
            f"| {name} | {r['min']:.1f} | {r['median']:.1f} | {r['max']:.1f} | "
            f"{batch / r['median'] * 1e3:,.0f} | {', '.join(f'{m:.1f}' for m in r['runs'])} |"
        )
    per_run = ", ".join(f"{x:.2f}x" for x in s["speedups"])
    lines += [
        "",
        f"embcore speed-up over plain PyTorch (same repeat): median {s['speedup']:.2f}x "
        f"(per repeat: {per_run}); target >= 1.5x: {'met' if s['speedup'] >= 1.5 else 'not met'}",
    ]
    return "\n".join(lines) + "\n"
