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
* **TorchRec DLRM** (eager, where torchrec and fbgemm_gpu import): TorchRec's own model over
  the same tables and MLP sizes, its tables updated by FBGEMM inside backward
  (:mod:`sidebyside.torchrec_dlrm`); ``KeyedJaggedTensor`` inputs built ahead.

With ``compile`` (the command's default), both run a second time through ``torch.compile``,
as ``embcore train --set train.compile=true`` does (:func:`embcore.train.loop.compiled`: the
model compiled, the loss, backward and optimizers around it eager; the plain model the same
way, its ``EmbeddingBag`` s inside the graph). Each compiled system's first step, which
compiles, is timed on its own, each in a new, empty Inductor cache directory (a cold compile,
what a first run pays).

Interleaved: every repeat runs each system for ``steps`` timed steps in turn (A B C D, ...);
reported per system are min / median / max of the per-repeat medians, and every ratio is
taken within each repeat (one median over another of the same repeat).
"""

from __future__ import annotations

import itertools
import os
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from embcore.train.config import Config
from embcore.train.loop import compiled
from embcore.train.model import build_model, dense_lr, dense_optimizer, embedding_optimizer
from embcore.train.sources import build_source
from sidebyside import torchrec_dlrm

__all__ = [
    "MainJobOptions",
    "current_section",
    "embcore_step",
    "markdown",
    "run",
    "section",
    "summarize",
    "with_section",
]

Step = Callable[[int], float]

#: the systems' names: eager ones (always) and compiled ones (with ``compile``)
EAGER = ("embcore", "plain PyTorch")
COMPILED = ("embcore, compiled", "plain PyTorch, compiled")
#: (what, peer, the system named first in ``what``): the peer's ms/step over the first's
#: within each repeat, the first-named system's speed-up
RATIOS = [
    ("embcore vs plain PyTorch, both eager", "plain PyTorch", "embcore"),
    ("embcore vs plain PyTorch, both compiled", "plain PyTorch, compiled", "embcore, compiled"),
    ("embcore vs TorchRec DLRM, both eager", "TorchRec DLRM", "embcore"),
    ("embcore: compiled vs eager", "embcore", "embcore, compiled"),
    ("plain PyTorch: compiled vs eager", "plain PyTorch", "plain PyTorch, compiled"),
]
SECTION = "## Main job"


@dataclass
class MainJobOptions:
    """What to run: ``overrides`` are ``section.key=value`` config settings (as ``--set``)."""

    repeats: int = 3
    warmup: int = 3
    steps: int = 20
    batches: int = 8
    overrides: list[str] = field(default_factory=list)
    compile: bool = False  # also both through torch.compile (``embcore bench --mainjob`` does)


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


def _embcore(cfg: Config, source: Any, data: list[Any], compile: bool = False) -> Step:
    model = build_model(
        cfg.model,
        source.vocab_sizes,
        optimizer=embedding_optimizer(cfg.optim),
        seed=cfg.train.seed,
        engine_options={"pipeline": cfg.train.pipeline},
        raw_ids=cfg.data.raw_ids,
    )
    opt = dense_optimizer(model, cfg.optim)  # as embcore train
    forward = compiled(model) if compile else model
    inputs = [(b.dense, b.labels, model.engine.prepare(model.features(b.sparse))) for b in data]
    model.train()
    counter = itertools.count(1)

    def step(i: int) -> float:
        dense, labels, prepared = inputs[i % len(inputs)]
        start = time.perf_counter()
        for group in opt.param_groups:
            group["lr"] = dense_lr(cfg.optim, next(counter), cfg.train.steps)
        loss = F.binary_cross_entropy_with_logits(forward(dense, prepared), labels)
        opt.zero_grad(set_to_none=True)
        loss.backward()  # also the engine's update
        opt.step()
        loss.detach().item()
        return time.perf_counter() - start

    step.model = model  # type: ignore[attr-defined]
    return step


def _plain(
    cfg: Config, source: Any, data: list[Any], like: nn.Module, compile: bool = False
) -> Step:
    if cfg.data.raw_ids or cfg.model.tables != "fixed":
        raise ValueError(
            "embcore bench --mainjob: the plain PyTorch peer has fixed tables of table rows; "
            f"got data.raw_ids={cfg.data.raw_ids} and model.tables={cfg.model.tables!r}"
        )
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
    forward = compiled(model) if compile else model
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
        loss = F.binary_cross_entropy_with_logits(forward(dense, columns), labels)
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


def _load() -> float | None:
    return os.getloadavg()[0] if hasattr(os, "getloadavg") else None


def run(options: MainJobOptions, log: Callable[[str], None] = print) -> dict:
    """Per system and repeat, the step times; the compiled systems' first (compiling) steps;
    the load average before each repeat; and the config they ran."""
    from torch._inductor.runtime.cache_dir_utils import temporary_cache_dir

    cfg = Config().with_overrides(options.overrides)
    threads = torch.get_num_threads()
    torch.set_num_threads(cfg.train.threads or threads)
    compile_s: dict[str, float] = {}
    loads: list[float | None] = []
    try:
        source = build_source(cfg.data)
        data = list(itertools.islice(source.train_batches(0), options.batches))
        ours = _embcore(cfg, source, data)
        like = ours.model  # type: ignore[attr-defined]
        systems = {"embcore": ours, "plain PyTorch": _plain(cfg, source, data, like)}
        if (missing := torchrec_dlrm.unavailable()) is None:
            systems[torchrec_dlrm.NAME] = torchrec_dlrm.build(cfg, source, data)
        else:
            log(f"[main job] {torchrec_dlrm.NAME} skipped: {missing}")
        if options.compile:
            systems[COMPILED[0]] = _embcore(cfg, source, data, compile=True)
            systems[COMPILED[1]] = _plain(cfg, source, data, like, compile=True)
        times: dict[str, list[list[float]]] = {name: [] for name in systems}
        i = 0
        for name in COMPILED if options.compile else ():
            # a cold compile: each in a new, empty cache directory (and Inductor's in-memory
            # caches cleared), nothing reused from earlier runs or from the other system
            with (
                tempfile.TemporaryDirectory(prefix="embcore-bench-inductor-") as cache,
                temporary_cache_dir(cache),
            ):
                loads.append(_load())
                compile_s[name] = systems[name](i)
            i += 1
            log(f"[main job] {name}: the first step, compiling, took {compile_s[name]:.1f} s")
        for step in systems.values():
            for _ in range(options.warmup):
                step(i)
                i += 1
        for repeat in range(options.repeats):
            loads.append(_load())
            for name, step in systems.items():  # interleaved: A B C D, A B C D, ...
                times[name].append([step(i + k) for k in range(options.steps)])
                log(
                    f"[main job, repeat {repeat + 1}] {name}: "
                    f"{1e3 * float(np.median(times[name][-1])):.1f} ms/step"
                )
            i += options.steps
        loads.append(_load())
        torch_threads = torch.get_num_threads()
    finally:
        torch.set_num_threads(threads)
    return {
        "options": asdict(options),
        "batch_size": cfg.data.batch_size,
        "threads": torch_threads,
        "default_compile": cfg.train.compile,
        "config": {"model": asdict(cfg.model), "optim": asdict(cfg.optim)},
        "step_s": times,
        "compile_s": compile_s,
        "inductor_cache": "cold (a new, empty TORCHINDUCTOR_CACHE_DIR each)" if compile_s else None,
        "load_average": loads,
    }


def summarize(results: dict) -> dict:
    """Per system min / median / max (ms) of the per-repeat medians; the speed-ups of the
    plain peer over embcore within each repeat, and their median (both eager, or both in
    ``embcore train``'s default mode); and each of :data:`RATIOS` the same way."""
    medians = {
        name: [1e3 * float(np.median(r)) for r in runs] for name, runs in results["step_s"].items()
    }
    rows = {
        name: {"min": min(m), "median": float(np.median(m)), "max": max(m), "runs": m}
        for name, m in medians.items()
    }
    ratios = {}
    for what, slow, fast in RATIOS:
        if slow in medians and fast in medians:
            per_repeat = [a / b for a, b in zip(medians[slow], medians[fast], strict=True)]
            ratios[what] = {"runs": per_repeat, "median": float(np.median(per_repeat))}
    default = RATIOS[1][0] if results.get("default_compile") else RATIOS[0][0]
    if default not in ratios:
        default = RATIOS[0][0]
    return {
        "systems": rows,
        "ratios": ratios,
        "default": default,
        "speedups": ratios[default]["runs"],
        "speedup": ratios[default]["median"],
    }


def markdown(results: dict) -> str:
    """The main job tables: ms/step and samples/s per system, the ratios, the compile times."""
    s = summarize(results)
    batch = results["batch_size"]
    o = results["options"]
    lines = [
        f"Main job (`embcore train` defaults: batch {batch}, {results['threads']} torch "
        f"thread(s)); {o['repeats']} interleaved repeats of {o['steps']} timed steps per "
        f"system after {o['warmup']} warm-up steps; min / median / max of the per-repeat "
        "medians.",
        "",
        "| system | min ms/step | median ms/step | max ms/step | samples/s (median) | runs |",
        "|---|---:|---:|---:|---:|---|",
    ]
    for name, r in s["systems"].items():
        lines.append(
            f"| {name} | {r['min']:.1f} | {r['median']:.1f} | {r['max']:.1f} | "
            f"{batch / r['median'] * 1e3:,.0f} | {', '.join(f'{m:.1f}' for m in r['runs'])} |"
        )
    lines += [
        "",
        "Speed-up of the first-named system over the second (the second's ms/step over the "
        "first's within each repeat; median over the repeats):",
        "",
        "| speed-up | median | per repeat |",
        "|---|---:|---|",
    ]
    for what, r in s["ratios"].items():
        per_run = ", ".join(f"{x:.2f}x" for x in r["runs"])
        lines.append(f"| {what} | {r['median']:.2f}x | {per_run} |")
    compile_s = results.get("compile_s") or {}
    if compile_s:
        lines += [
            "",
            f"First step of each compiled system, which compiles; Inductor cache "
            f"{results['inductor_cache']}: "
            + ", ".join(f"{name} {sec:.1f} s" for name, sec in compile_s.items())
            + ". A rerun with a warm cache compiles much faster (docs/main_job.md, "
            '"torch.compile").',
        ]
    loads = [x for x in results.get("load_average") or [] if x is not None]
    if loads:
        lines += [
            "",
            f"1-minute load average during the run: {min(loads):.1f} to {max(loads):.1f}.",
        ]
    mode = "compiled" if results.get("default_compile") else "eager"
    lines += [
        "",
        f"embcore speed-up over plain PyTorch in `embcore train`'s default mode ({mode}; same "
        f"repeat): median {s['speedup']:.2f}x (per repeat: "
        + ", ".join(f"{x:.2f}x" for x in s["speedups"])
        + f"); target >= 1.5x: {'met' if s['speedup'] >= 1.5 else 'not met'}",
    ]
    return "\n".join(lines) + "\n"


def section(results: dict, command: str) -> str:
    """BENCHMARKS.md's main-job section: the command that regenerates it, and the tables."""
    return (
        f"{SECTION}\n\n"
        "embcore's DLRM (`embcore train`'s model, data and optimizers) against the same DLRM in "
        "plain PyTorch (`nn.EmbeddingBag(sparse=True)` + `optim.Adagrad`, `optim.Adam`), eager "
        "and through `torch.compile`, and TorchRec's own DLRM (`torchrec.models.dlrm.DLRM` over "
        "a `FusedEmbeddingBagCollection`: FBGEMM's fused Adagrad; eager, where torchrec is "
        "installed), on the same batches (`benchmarks/sidebyside/mainjob.py`). Regenerated, this "
        "section only, by:\n\n"
        f"```\n{command}\n```\n\n" + markdown(results)
    )


def with_section(document: str, text: str | None, section: str = SECTION) -> str:
    """``document`` (BENCHMARKS.md) with its ``section`` (default: the main job's) replaced by
    ``text`` (added before the next section after "## Results", or at the end, if it has
    none); ``text`` None keeps the document as it is."""
    if text is None:
        return document
    text = text.rstrip("\n") + "\n\n"
    start = document.find(section + "\n")
    if start >= 0:
        end = document.find("\n## ", start + len(section))
        end = len(document) if end < 0 else end + 1
        return document[:start] + text + document[end:].lstrip("\n")
    results = document.find("## Results\n")
    after = document.find("\n## ", results + 1) if results >= 0 else -1
    if after < 0:
        return document.rstrip("\n") + "\n\n" + text
    return document[: after + 1] + text + document[after + 1 :]


def current_section(document: str, section: str = SECTION) -> str | None:
    """The ``section`` (default: the main job's) of ``document`` (BENCHMARKS.md), or None."""
    start = document.find(section + "\n")
    if start < 0:
        return None
    end = document.find("\n## ", start + len(section))
    return document[start : len(document) if end < 0 else end + 1]
