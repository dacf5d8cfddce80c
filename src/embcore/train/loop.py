"""The training loop behind ``embcore train``: train, evaluate, checkpoint, resume, report.

One step: the next batch (generated and converted for the engine in a background thread), a
forward pass, the mean binary cross-entropy, ``loss.backward()`` (which also applies the
engine's optimizer to the looked-up rows) and an Adam step on the dense weights. Every
``eval_every`` steps the held-out rows are scored; every ``checkpoint_every`` steps a checkpoint
is written atomically.

Resuming restores the model, both optimizers' state, the metric history and the running loss
sums (:class:`RunState`) from the latest checkpoint, and reads the data from the step it stopped
at, so a resumed run ends with exactly the tables and metrics of an uninterrupted one.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

import embcore as ec
from embcore._atomic import write_atomic
from embcore.errors import UserError, reading
from embcore.models import DLRM
from embcore.train.bag_model import engine_inputs
from embcore.train.config import Config
from embcore.train.contract import describe_ids, id_mode, missing_id
from embcore.train.metrics import auc, log_loss
from embcore.train.model import (
    build_model,
    dense_lr,
    dense_optimizer,
    embedding_optimizer,
    embedding_rows,
)
from embcore.train.progress import progress
from embcore.train.report import plot_curves, summary_table
from embcore.train.resources import check_resources
from embcore.train.resume import check_resumable
from embcore.train.run_dir import ROWS, RunDirectory
from embcore.train.run_state import (
    checkpoint_path,
    latest_checkpoint,
    load_checkpoint,
    optimizer_from_tensors,
    optimizer_to_tensors,
    prune_checkpoints,
    save_checkpoint,
)
from embcore.train.sources import EvalSet, run_source

__all__ = ["Interrupted", "RunState", "TrainResult", "evaluate", "train"]


class Interrupted(KeyboardInterrupt):
    """Ctrl-C stopped a run; the message says where and how to continue."""


Echo = Callable[[str], None]


@dataclass
class RunState:
    """Where a run is and what it has measured: the JSON part of a checkpoint.

    Attributes:
        step: steps done.
        history: ``{"loss": [[step, mean loss], ...], "eval": [{"step", "auc", "log_loss"}]}``.
        loss_sum, loss_count: the losses since the last point of ``history["loss"]``.
    """

    step: int = 0
    history: dict[str, list] = field(default_factory=lambda: {"loss": [], "eval": []})
    loss_sum: float = 0.0
    loss_count: int = 0

    def add_loss(self, value: float, log_every: int) -> bool:
        """Count one step's loss; True when it closed a point of the loss curve."""
        self.loss_sum += value
        self.loss_count += 1
        if self.step % log_every:
            return False
        self.history["loss"].append([self.step, self.loss_sum / self.loss_count])
        self.loss_sum, self.loss_count = 0.0, 0
        return True


@dataclass(frozen=True)
class TrainResult:
    """What a run produced.

    Attributes:
        config: the run's config.
        model: the trained model (in eval mode).
        final: ``{"auc", "log_loss"}`` on the held-out rows at the last evaluation.
        best: the same for the true probabilities (synthetic data), else ``None``.
        history: as :attr:`RunState.history`.
        steps: steps done in total; ``resumed_from``: the checkpoint step it started at (0).
        seconds: wall time of this process's training steps (not set-up, evaluation or
            checkpoints); ``samples_per_second`` follows from it.
        checkpoint: the last checkpoint written (``None`` if none).
        skipped_rows: malformed rows skipped per file (``data.bad_rows = "skip"``).
    """

    config: Config
    model: DLRM
    final: dict[str, float]
    best: dict[str, float] | None
    history: dict[str, list]
    steps: int
    resumed_from: int
    seconds: float
    samples_per_second: float
    checkpoint: Path | None
    skipped_rows: dict[str, int] = field(default_factory=dict)


def evaluate(model: DLRM, eval_set: EvalSet) -> np.ndarray:
    """``(n,) float64`` logits of the held-out rows (eval mode, no updates)."""
    was_training = model.training
    model.eval()
    with torch.no_grad():
        logits = [model(b.dense, b.sparse).double().numpy() for b in eval_set.batches]
    model.train(was_training)
    return np.concatenate(logits)


def _metrics(labels: np.ndarray, logits: np.ndarray) -> dict[str, float]:
    return {"auc": auc(labels, logits), "log_loss": log_loss(labels, logits)}


# ------------------------------------------------------------------------- checkpoints
def _save(
    cfg: Config, model: DLRM, optimizer: torch.optim.Optimizer, state: RunState, best: Any
) -> Path:
    tensors = {f"model/{k}": v for k, v in model.state_dict().items()}
    opt_tensors, opt_meta = optimizer_to_tensors(optimizer, "optimizer")
    tensors.update(opt_tensors)
    tensors["rng/torch"] = torch.get_rng_state()
    meta = {
        **dataclasses.asdict(state),
        "config": cfg.to_dict(),
        "optimizer": opt_meta,
        "best": best,
    }
    ckpt_dir = Path(cfg.train.out_dir) / "checkpoints"
    path = save_checkpoint(checkpoint_path(ckpt_dir, state.step), tensors, meta)
    prune_checkpoints(ckpt_dir, cfg.train.keep_checkpoints)
    return path


def _restore(
    cfg: Config, model: DLRM, optimizer: torch.optim.Optimizer, path: Path, echo: Echo
) -> RunState:
    with reading(path, "an embcore training checkpoint"):
        tensors, meta = load_checkpoint(path)
        saved = Config.from_dict(meta["config"])
    check_resumable(cfg, saved, path, echo)
    if meta["step"] > cfg.train.steps:
        raise UserError(
            f"--resume: checkpoint {path} is at step {meta['step']}, past train.steps="
            f"{cfg.train.steps}"
        )
    with reading(path, "a checkpoint of this run's model"):
        model.load_state_dict({k[6:]: v for k, v in tensors.items() if k.startswith("model/")})
        optimizer_from_tensors(optimizer, tensors, meta["optimizer"], "optimizer")
        torch.set_rng_state(tensors["rng/torch"])
        fields = {f.name for f in dataclasses.fields(RunState)}
        return RunState(**{k: v for k, v in meta.items() if k in fields})


# ---------------------------------------------------------------------------- the run
def train(
    config: Config,
    *,
    resume: bool = False,
    overwrite: bool = False,
    stop_at: int | None = None,
    echo: Echo = print,
) -> TrainResult:
    """Run the job of ``config`` (see the module docstring).

    Args:
        config: the whole job.
        resume: continue from the latest checkpoint in ``out_dir/checkpoints`` (if any).
        overwrite: replace an earlier run in ``out_dir``; its checkpoints are deleted only
            once this run has written its first one (see :mod:`embcore.train.run_dir`).
        stop_at: stop after this step as if killed (its checkpoint, if one is due, is written);
            for tests and for splitting a run in parts.
        echo: where messages go.

    Raises:
        UserError: ``out_dir`` holds an earlier run and neither ``resume`` nor ``overwrite``
            is given; a data file or the checkpoint to resume from is unusable; a config value
            cannot work on this machine.
        Interrupted: Ctrl-C; its message says how to continue.
    """
    threads = torch.get_num_threads()
    if config.train.threads:
        torch.set_num_threads(config.train.threads)
    # The run's global RNG starts from train.seed (torch seeds each process at random) and is
    # saved in checkpoints; the caller's RNG state is left as it was.
    run_dir = RunDirectory(config.train.out_dir, resume=resume, overwrite=overwrite)
    try:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(config.train.seed)
            return _train(config, run_dir, stop_at, echo)
    except Interrupted:
        raise
    except KeyboardInterrupt:  # Ctrl-C while setting up (reading data, building the model)
        newest = latest_checkpoint(run_dir.checkpoints)
        raise Interrupted(_interrupted(None, newest, run_dir.kept_run())) from None
    finally:
        torch.set_num_threads(threads)


def _storage(cfg: Config, run_dir: RunDirectory) -> ec.DiskStorage | None:
    """The tables' storage: ``model.storage="disk"`` puts them under ``out_dir/rows``."""
    if cfg.model.storage != "disk":
        return None
    return ec.DiskStorage(run_dir.root / ROWS, cfg.model.cache_bytes)


def _train(cfg: Config, run_dir: RunDirectory, stop_at: int | None, echo: Echo) -> TrainResult:
    run_dir.check()
    check_resources(cfg)
    source = run_source(cfg)
    cfg = source.run_config(cfg)  # a finite source (movielens) sets the steps from its epochs
    eval_set = source.eval_set()  # read (and checked) before anything is written
    model = build_model(
        cfg.model,
        source.vocab_sizes,
        optimizer=embedding_optimizer(cfg.optim),
        seed=cfg.train.seed,
        engine_options={"pipeline": cfg.train.pipeline, "storage": _storage(cfg, run_dir)},
        raw_ids=cfg.data.raw_ids,
        layout=source.layout,
        pad=missing_id(cfg),
    )
    optimizer = dense_optimizer(model, cfg.optim)
    forward = compiled(model) if cfg.train.compile else model
    found = run_dir.open(echo)
    state = RunState()
    if found is not None:
        state = _restore(cfg, model, optimizer, found, echo)
        echo(f"resuming from {found} (step {state.step:,})")
    resumed_from = state.step

    labels = eval_set.labels
    echo(f"data: {source.describe()}; {eval_set.rows:,} held-out rows")
    echo(describe_ids(cfg))
    rows = (
        "dynamic tables (a row per id seen)"
        if cfg.model.tables == "dynamic"
        else f"{sum(source.vocab_sizes):,} embedding rows"
    )
    echo(
        f"model: {sum(p.numel() for p in model.parameters()):,} dense weights, "
        f"{rows} x {cfg.model.embedding_dim}"
    )
    best = None
    if eval_set.true_probs is not None:
        p = eval_set.true_probs
        best = _metrics(labels, np.log(p) - np.log1p(-p))
        echo(
            f"best reachable AUC {best['auc']:.4f}, log loss {best['log_loss']:.4f} "
            "(the hidden model's own probabilities on the held-out rows)"
        )

    last = cfg.train.steps if stop_at is None else min(stop_at, cfg.train.steps)
    batches = itertools.islice(source.train_batches(state.step), max(last - state.step, 0))
    prefetch = ec.Prefetcher(
        model.engine,
        batches,
        split=lambda b: ((b.dense, b.labels), *engine_inputs(model, b.sparse)),
    )
    bar = progress(cfg.train.progress, cfg.train.steps, state.step, cfg.data.batch_size, echo=echo)
    log = bar.write if bar is not None else echo
    checkpoint = found
    seconds, samples, tick = 0.0, 0, time.perf_counter()
    model.train()
    try:
        for (dense, y), prepared in prefetch:
            state.step += 1
            for group in optimizer.param_groups:
                group["lr"] = dense_lr(cfg.optim, state.step, cfg.train.steps)
            loss = F.binary_cross_entropy_with_logits(forward(dense, prepared), y)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()  # also applies the engine's optimizer to the looked-up rows
            optimizer.step()
            samples += y.shape[0]
            if cfg.train.compile and state.step == resumed_from + 1:
                log(f"torch.compile: the first step, compiling, took {_since(tick):.1f} s")
            closed = state.add_loss(loss.detach().item(), cfg.train.log_every)
            if bar is not None:
                bar.update(y.shape[0], state.history["loss"][-1][1] if closed else None)
            done = state.step == cfg.train.steps
            if state.step % cfg.train.eval_every == 0 or done:
                seconds += time.perf_counter() - tick
                metrics = _metrics(labels, evaluate(model, eval_set))
                state.history["eval"].append({"step": state.step, **metrics})
                log(
                    f"step {state.step:>7,}  eval AUC {metrics['auc']:.4f}  "
                    f"log loss {metrics['log_loss']:.4f}"
                )
                tick = time.perf_counter()
            if state.step % cfg.train.checkpoint_every == 0 or done:
                seconds += time.perf_counter() - tick
                checkpoint = _save(cfg, model, optimizer, state, best)
                run_dir.published()
                tick = time.perf_counter()
        seconds += time.perf_counter() - tick
    except KeyboardInterrupt:
        # What is on disk, not what this loop last heard of: Ctrl-C may land inside a save,
        # after its checkpoint was published.
        newest = latest_checkpoint(run_dir.checkpoints)
        raise Interrupted(_interrupted(state.step, newest, run_dir.kept_run())) from None
    finally:
        prefetch.close()
        if bar is not None:
            bar.close()
    skipped = source.skipped_rows()
    if any(skipped.values()):
        echo(
            f'skipped {sum(skipped.values()):,} malformed row(s) (data.bad_rows = "skip"): '
            + ", ".join(f"{n:,} in {path}" for path, n in skipped.items() if n)
        )

    model.eval()
    last_eval = state.history["eval"][-1] if state.history["eval"] else {}
    result = TrainResult(
        config=cfg,
        model=model,
        final={k: v for k, v in last_eval.items() if k != "step"},
        best=best,
        history=state.history,
        steps=state.step,
        resumed_from=resumed_from,
        seconds=seconds,
        samples_per_second=samples / seconds if seconds > 0 else 0.0,
        checkpoint=checkpoint,
        skipped_rows=skipped,
    )
    if state.step == cfg.train.steps:
        _write_outputs(result, echo)
    return result


def compiled(model: torch.nn.Module) -> Any:
    """``torch.compile(model)``: one graph with the engine's operators, compiled by Inductor at
    the first call; batch sizes may vary (one recompilation makes the graph size-generic). On
    CPU with ``max-autotune-no-cudagraphs``'s Inductor settings: Inductor times its C++ GEMM
    templates against ATen's for the matrix products and keeps the faster (docs/main_job.md,
    "torch.compile": on the default job, one product 35% faster, same compile time)."""
    with warnings.catch_warnings():  # Inductor's own import uses a deprecated TorchScript API
        warnings.filterwarnings("ignore", "`torch.jit.script_method`", DeprecationWarning)
        import torch._inductor.compile_fx
        import torch._inductor.select_algorithm
    # PyTorch's own warnings while it compiles, none about the caller's code: dynamo builds the
    # autograd.Function objects it traces, Inductor's GEMM autotuning reads a TypedStorage
    warnings.filterwarnings("ignore", ".*should not be instantiated", DeprecationWarning, "torch")
    warnings.filterwarnings("ignore", "TypedStorage is deprecated", UserWarning, "torch")
    if next(model.parameters()).device.type != "cpu":
        return torch.compile(model)
    # max-autotune-no-cudagraphs's settings (coordinate descent tunes only Triton kernels),
    # for this compile only, without its tables of timings on stderr
    options = {"max_autotune": True, "max_autotune_report_choices_stats": False}
    torch._inductor.select_algorithm.PRINT_AUTOTUNE = False  # a module flag, not a config key
    return torch.compile(model, options=options)


def _since(tick: float) -> float:
    return time.perf_counter() - tick


def _interrupted(step: int | None, checkpoint: Path | None, kept: Path | None) -> str:
    """What Ctrl-C at ``step`` (``None``: before the first step) leaves: this run's newest
    checkpoint, or the earlier run an ``--overwrite`` was replacing (``kept``), or nothing."""
    at = "before the first step" if step is None else f"at step {step:,}"
    if kept is not None:
        return (
            f"interrupted {at}, before this run's first checkpoint; the earlier run it was "
            f"replacing is kept in {kept.parent} (newest {kept.name}): add --resume to "
            "continue that run, or run the same command again to start over"
        )
    if checkpoint is not None:
        return (
            f"interrupted {at}; the newest checkpoint is {checkpoint}: add --resume to the "
            "same command to continue from it"
        )
    if step is None:
        return f"interrupted {at}; nothing was written: run the same command again to start"
    return (
        f"interrupted {at}, before the first checkpoint: nothing to resume; "
        "run the same command again to start over"
    )


def _write_outputs(result: TrainResult, echo: Echo) -> None:
    out = Path(result.config.train.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    summary = {
        "steps": result.steps,
        "samples": result.steps * result.config.data.batch_size,
        "final": result.final,
        "best": result.best,
        "seconds": result.seconds,
        "samples_per_second": result.samples_per_second,
        "resumed_from": result.resumed_from,
        "checkpoint": str(result.checkpoint),
        "skipped_rows": result.skipped_rows,
        "embedding_rows": embedding_rows(result.model),
        "ids": id_mode(result.config),
    }
    write_atomic(out / "summary.json", (json.dumps(summary, indent=2) + "\n").encode())
    write_atomic(out / "history.json", (json.dumps(result.history, indent=2) + "\n").encode())
    if result.config.train.plot:
        plot_curves(result.history, result.best, out / "curves.png")
    echo(summary_table(result.config, summary, out))
