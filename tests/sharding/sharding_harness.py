"""Multi-process test material for sharded training: a launcher and the shared cases.

:func:`launch` runs a function of this module on ``world`` processes joined in a gloo process
group (a file store in a temporary directory, so no ports) and returns what each rank returned.
Processes fork from a forkserver that has imported torch and embcore once, so a launch costs
well under a second after the first.

The cases are built identically in the test process (the single-process reference) and in the
workers (the sharded run) from names, so nothing but names and results crosses processes.
"""

from __future__ import annotations

import importlib
import os
import tempfile
import traceback
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import embcore as ec
from embcore.initializers import initial_rows
from embcore.sharding import ShardingPlan, TableShard

SCHEME_CASES = ["table_wise", "row_wise:div", "row_wise:mod", "column_wise", "data_parallel"]

#: Raw 64-bit keys standing for ids 0..10 of the dynamic tables of ``key_hash`` cases (both
#: extremes, negatives, and keys equal modulo small numbers).
KEYS = torch.tensor(
    [-(2**63), 2**63 - 1, -1, 0, 7, 2**32 + 7, 8_231_778_211_409, -3, 2**40, 4096, 8192],
    dtype=torch.int64,
)

#: One entry per optimizer (and the options that change how rows move); names -> factory.
OPTIMIZERS: dict[str, Callable[[], ec.Optimizer]] = {
    "sgd": lambda: ec.SGD(learning_rate=0.1),
    "sgd-clip-decay-wclip": lambda: ec.SGD(
        learning_rate=0.2,
        clipvalue=(-0.3, 0.4),
        weight_decay_factor=0.05,
        clip_weight_min=-0.4,
        clip_weight_max=0.45,
    ),
    "adagrad": lambda: ec.Adagrad(learning_rate=0.1, initial_accumulator_value=0.05),
    "adagrad_momentum": lambda: ec.AdagradMomentum(learning_rate=0.1, momentum=0.8),
    "adam": lambda: ec.Adam(learning_rate=0.05),
    "adam-nonlazy": lambda: ec.Adam(learning_rate=0.05, lazy_adam=False),
    "ftrl": lambda: ec.FTRL(learning_rate=0.2, l1_regularization_strength=0.01),
    "rowwise_adagrad": lambda: ec.RowwiseAdagrad(learning_rate=0.1),
}

STEPS = 3


def custom_initializer(shape: tuple[int, ...], dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """A user initializer (full-table shape), deterministic."""
    rows, dim = shape
    return torch.arange(rows * dim, dtype=dtype).reshape(rows, dim).sin()


SHAPES = {"a": (7, 4), "b": (2, 5), "c": (11, 6)}
_DEFAULTS: dict[str, torch.Tensor] = {}


def _cached_default(name: str) -> Callable[..., torch.Tensor]:
    """An initializer returning exactly the default initial value (engine seed 0).

    Drawing the default value costs a 65,536-row block per table; the reference engines and
    most sharded runs reuse one draw. The sharded runs of ``Case.default_init`` cases draw
    their own pieces, which is what checks that sharded initialization equals the full one.
    """

    def init(shape: tuple[int, ...], dtype: torch.dtype = torch.float32) -> torch.Tensor:
        if name not in _DEFAULTS:
            _DEFAULTS[name] = initial_rows(name, *SHAPES[name], None, 0)
        return _DEFAULTS[name].clone()

    return init


def feature_config(init: str = "cached", dynamic: bool = False) -> dict[str, ec.FeatureConfig]:
    """Three tables with uneven vocabularies: ``b`` is smaller than a world of 3.

    ``init``: ``"default"`` (the engine's own), ``"cached"`` (the same values, drawn once) or
    ``"custom"`` (a user initializer on table ``c``). ``dynamic``: ``a`` and ``c`` are
    dynamic tables (``a`` admits keys seen twice and has a user initializer, whose rows
    depend on their position in each call; ``c`` has the default one and evicts after one
    step unseen and beyond 6 rows).
    """
    if dynamic:
        return _dynamic_feature_config()

    def initializer(name: str) -> Any:
        if init == "default" or (init == "custom" and name != "c"):
            return None
        return custom_initializer if init == "custom" else _cached_default(name)

    a = ec.TableConfig(
        vocabulary_size=7, dim=4, name="a", combiner="mean", initializer=initializer("a")
    )
    b = ec.TableConfig(
        vocabulary_size=2, dim=5, name="b", combiner="sum", initializer=initializer("b")
    )
    c = ec.TableConfig(
        vocabulary_size=11, dim=6, name="c", combiner="sqrtn", initializer=initializer("c")
    )
    return {
        "a1": ec.FeatureConfig(table=a),
        "a2": ec.FeatureConfig(table=a),
        "b": ec.FeatureConfig(table=b),
        "c_pool": ec.FeatureConfig(table=c),
        "c_seq": ec.FeatureConfig(table=c, max_sequence_length=3),
    }


def _dynamic_feature_config() -> dict[str, ec.FeatureConfig]:
    a = ec.TableConfig(
        vocabulary_size=None, dim=4, name="a", combiner="mean",
        admission=ec.CountAdmission(min_count=2), initializer=custom_initializer,
    )  # fmt: skip
    b = ec.TableConfig(vocabulary_size=2, dim=5, name="b", combiner="sum")
    c = ec.TableConfig(
        vocabulary_size=None, dim=6, name="c", combiner="sqrtn",
        eviction=ec.Eviction(steps_to_live=1, max_rows=6),
    )  # fmt: skip
    return {
        "a1": ec.FeatureConfig(table=a),
        "a2": ec.FeatureConfig(table=a),
        "b": ec.FeatureConfig(table=b),
        "c_pool": ec.FeatureConfig(table=c),
        "c_seq": ec.FeatureConfig(table=c, max_sequence_length=3),
    }


@dataclass(frozen=True)
class Case:
    """One sharded-vs-single-process run."""

    scheme: str  # a SCHEME_CASES entry, "mixed" or "auto"
    optimizer: str
    world: int
    pipeline: bool = False

    @property
    def id(self) -> str:
        return f"w{self.world}-{self.scheme}-{self.optimizer}" + (
            "-pipelined" if self.pipeline else ""
        )

    @property
    def dynamic(self) -> bool:
        """Tables ``a`` and ``c`` are dynamic, placed by key hash (``b`` table-wise)."""
        return self.scheme == "key_hash"

    @property
    def init(self) -> str:
        """How the sharded run initializes (the reference uses the same values, cached)."""
        if self.scheme == "mixed":
            return "custom"
        return "default" if self.optimizer == "adagrad" or self.dynamic else "cached"

    def feature_config(self, init: str) -> dict[str, ec.FeatureConfig]:
        return feature_config(init, dynamic=self.dynamic)

    @property
    def reference_init(self) -> str:
        return "custom" if self.init == "custom" else "cached"

    def plan(self) -> ShardingPlan | None:
        w = self.world
        every = list(range(w))
        dims = {"a": 4, "b": 5, "c": 6}
        if self.scheme == "auto":
            return None
        if self.scheme == "mixed":
            tables = {
                "a": TableShard.row_wise(list(reversed(every))[: max(1, w - 1)], "mod"),
                "b": TableShard.table_wise(w - 1),
                "c": TableShard.column_wise(every, 6)
                if self.optimizer != "rowwise_adagrad"
                else TableShard.row_wise(every, "div"),
            }
            return ShardingPlan(world_size=w, tables=tables)
        if self.dynamic:  # a over all ranks; c over the ranks in reverse, b on the last
            return ShardingPlan(
                world_size=w,
                tables={
                    "a": TableShard(scheme="key_hash", ranks=tuple(every)),
                    "b": TableShard.table_wise(w - 1),
                    "c": TableShard(scheme="key_hash", ranks=tuple(reversed(every))),
                },
            )
        scheme, _, strategy = self.scheme.partition(":")
        shard: dict[str, TableShard] = {}
        for i, name in enumerate(dims):
            if scheme == "table_wise":
                shard[name] = TableShard.table_wise(i % w)
            elif scheme == "row_wise":
                shard[name] = TableShard.row_wise(every, strategy)
            elif scheme == "column_wise":
                shard[name] = TableShard.column_wise(every, dims[name])
            else:
                shard[name] = TableShard.data_parallel(w)
        return ShardingPlan(world_size=w, tables=shard)

    def engine_kwargs(self) -> dict[str, Any]:
        """The reference backend, whose float operations the exact schemes reproduce; the
        planner's case runs the default backend."""
        backend = "auto" if self.scheme == "auto" else "reference"
        return {"backend": backend, "pipeline": self.pipeline}


def all_cases(world: int) -> list[Case]:
    cases = [
        Case(scheme, opt, world)
        for scheme in SCHEME_CASES
        for opt in OPTIMIZERS
        if not (scheme == "column_wise" and opt == "rowwise_adagrad")
    ]
    cases += [Case("mixed", opt, world) for opt in ("adagrad", "rowwise_adagrad", "adam-nonlazy")]
    cases += [Case("auto", "adagrad", world), Case("mixed", "ftrl", world, pipeline=True)]
    cases += [Case("key_hash", opt, world) for opt in ("adagrad", "adam-nonlazy")]
    cases += [Case("key_hash", "sgd", world, pipeline=True)]
    return cases


# ---------------------------------------------------------------------------------- inputs
def _gen(case: Case, step: int, rank: int) -> torch.Generator:
    return torch.Generator().manual_seed(10_000 * step + 100 * rank + len(case.id))


def local_batch(case: Case, step: int, rank: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """Rank ``rank``'s batch of a step: ``(features, weights)``; batch size 3 + rank."""
    g = _gen(case, step, rank)
    n = 3 + rank

    def ragged(vocab: int, max_len: int, weighted: bool) -> tuple[ec.RaggedIds, Any]:
        lengths = torch.randint(0, max_len + 1, (n,), generator=g)
        splits = torch.zeros(n + 1, dtype=torch.int64)
        splits[1:] = torch.cumsum(lengths, 0)
        ids = torch.randint(0, vocab, (int(splits[-1]),), generator=g)
        w = None
        if weighted:
            w = ec.RaggedIds(torch.rand(ids.numel(), generator=g) + 0.25, splits)
        return ec.RaggedIds(ids, splits), w

    a2, a2w = ragged(7, 3, True)
    cp, cpw = ragged(11, 3, True)
    cs, _ = ragged(11, 4, False)
    features = {
        "a1": torch.randint(0, 7, (n,), generator=g),
        "a2": a2,
        "b": torch.randint(0, 2, (n, 1), generator=g),
        "c_pool": cp,
        "c_seq": cs,
    }
    weights = {"a1": None, "a2": a2w, "b": None, "c_pool": cpw, "c_seq": None}
    if case.dynamic:  # ids 0..10 stand for raw 64-bit keys
        for name in ("a1", "a2", "c_pool", "c_seq"):
            f = features[name]
            features[name] = (
                ec.RaggedIds(KEYS[f.values], f.row_splits)
                if isinstance(f, ec.RaggedIds)
                else KEYS[f]
            )
    return features, weights


def gradients(case: Case, step: int, rank: int, acts: dict[str, torch.Tensor]) -> dict[str, Any]:
    g = _gen(case, step, rank + 50)
    return {k: torch.randn(v.shape, generator=g) for k, v in sorted(acts.items())}


def concat(values: list[Any]) -> Any:
    """Concatenate ranks' inputs along the batch: tensors, RaggedIds or None."""
    if values[0] is None:
        return None
    if isinstance(values[0], ec.RaggedIds):
        splits, base = [values[0].row_splits[:1]], 0
        for v in values:
            splits.append(v.row_splits[1:] + base)
            base += v.values.numel()
        return ec.RaggedIds(torch.cat([v.values for v in values]), torch.cat(splits))
    return torch.cat(values)


def global_batch(case: Case, step: int) -> tuple[dict[str, Any], dict[str, Any]]:
    parts = [local_batch(case, step, r) for r in range(case.world)]
    features = {k: concat([p[0][k] for p in parts]) for k in parts[0][0]}
    weights = {k: concat([p[1][k] for p in parts]) for k in parts[0][1]}
    return features, weights


# ------------------------------------------------------------------------------ training
def train(
    engine: ec.EmbeddingEngine, case: Case, ranks: list[int]
) -> list[dict[str, torch.Tensor]]:
    """``STEPS`` steps alternating the PyTorch style and enqueue/dequeue/apply_gradients.

    ``ranks`` are the ranks whose batches this engine reads, concatenated (one rank for a
    sharded engine, all of them for the single-process reference). Returns the activations.
    """
    out = []
    for step in range(STEPS):
        parts = [local_batch(case, step, r) for r in ranks]
        features = {k: concat([p[0][k] for p in parts]) for k in parts[0][0]}
        weights = {k: concat([p[1][k] for p in parts]) for k in parts[0][1]}
        if step % 2 == 0:
            acts = engine(features, weights)
            grads = {
                k: concat(
                    [gradients(case, step, r, _slice(acts, case, step, ranks, r))[k] for r in ranks]
                )
                for k in acts
            }
            loss = sum((acts[k] * grads[k]).sum() for k in acts)
            loss.backward()
        else:
            engine.enqueue(features, weights)
            acts = engine.dequeue()
            grads = {
                k: concat(
                    [gradients(case, step, r, _slice(acts, case, step, ranks, r))[k] for r in ranks]
                )
                for k in acts
            }
            engine.apply_gradients(grads)
        out.append({k: v.detach().clone() for k, v in acts.items()})
    return out


def _slice(
    acts: dict[str, torch.Tensor], case: Case, step: int, ranks: list[int], rank: int
) -> dict:
    """The part of ``acts`` (over ``ranks``' concatenated batches) that belongs to ``rank``."""
    start = sum(3 + r for r in ranks if r < rank)
    return {k: v[start : start + 3 + rank] for k, v in acts.items()}


def final_state(engine: ec.EmbeddingEngine) -> dict[str, Any]:
    """Tables and slots (a dynamic table's: its keys' rows, in key order), the step, and the
    keys of the dynamic tables."""
    engine.flush()
    return {
        "tables": {k: v.clone() for k, v in engine.embedding_tables.items()},
        "slots": {
            t: {s: v.clone() for s, v in d.items()} for t, d in engine.slot_variables.items()
        },
        "step": engine.step,
        "keys": {t.name: engine.table_keys(t.name) for t in engine.tables if t.dynamic},
    }


def reference(case: Case) -> dict[str, Any]:
    """The single-process engine trained on the concatenation of every rank's batch."""
    engine = ec.EmbeddingEngine(
        case.feature_config(case.reference_init), ec_optimizer(case), **case.engine_kwargs()
    )
    initial = {k: v.clone() for k, v in engine.embedding_tables.items()}
    acts = train(engine, case, list(range(case.world)))
    return {"acts": acts, **final_state(engine), "initial": initial}


def ec_optimizer(case: Case) -> ec.Optimizer:
    return OPTIMIZERS[case.optimizer]()


# -------------------------------------------------------------------------------- workers
def worker_equivalence(rank: int, world: int, cases: list[Case]) -> dict[str, Any]:
    results = {}
    for case in cases:
        engine = ec.EmbeddingEngine(
            case.feature_config(case.init),
            ec_optimizer(case),
            plan=case.plan(),
            **case.engine_kwargs(),
        )
        if not isinstance(engine, ec.sharding.ShardedEmbeddingEngine):
            raise TypeError(f"expected a sharded engine under a process group, got {type(engine)}")
        acts = train(engine, case, [rank])
        results[case.id] = {"acts": acts, **final_state(engine), "plan": engine.plan.to_json()}
    return results


def checkpoint_cases() -> tuple[Case, Case]:
    """The run that writes (2 ranks, every scheme across the tables, mod on a subset of
    ranks) and the run that continues from it (3 ranks, another plan)."""
    return Case("mixed", "adagrad", 2), Case("row_wise:mod", "adagrad", 3)


def other_plan(world: int) -> ShardingPlan:
    """A plan unlike the writer's: a column-wise, b data-parallel, c row-wise div."""
    every = list(range(world))
    return ShardingPlan(
        world_size=world,
        tables={
            "a": TableShard.column_wise(every, 4),
            "b": TableShard.data_parallel(world),
            "c": TableShard.row_wise(every, "div"),
        },
    )


def worker_checkpoint_save(rank: int, world: int, path: str) -> dict[str, Any]:
    case, _ = checkpoint_cases()
    engine = ec.EmbeddingEngine(
        feature_config(case.init), ec_optimizer(case), plan=case.plan(), **case.engine_kwargs()
    )
    train(engine, case, [rank])
    ec.checkpoint.save(engine, path)
    return final_state(engine)


def worker_checkpoint_load(rank: int, world: int, paths: list[str]) -> dict[str, Any]:
    """Load each checkpoint into a fresh engine (another seed, another plan), report the
    state, then continue training from the first one."""
    written, cont = checkpoint_cases()
    out: dict[str, Any] = {}
    for i, path in enumerate(paths):
        plan = other_plan(world) if i % 2 == 0 else cont.plan()
        engine = ec.EmbeddingEngine(
            feature_config(written.init), ec_optimizer(cont), plan=plan, seed=7, backend="reference"
        )
        ec.checkpoint.load(engine, path)
        out[path] = final_state(engine)
        if i == 0:
            out["continued_acts"] = train(engine, cont, [rank])
            out["continued"] = final_state(engine)
    return out


def worker_errors(rank: int, world: int) -> dict[str, Any]:
    """Failure modes: each returns what every rank saw."""
    out: dict[str, Any] = {}
    case = Case("row_wise:div", "adagrad", world)
    for mode in ("raise", "skip"):
        engine = ec.EmbeddingEngine(
            feature_config(), ec_optimizer(case), plan=case.plan(), non_finite_gradients=mode
        )
        before = final_state(engine)["tables"]
        features, weights = local_batch(case, 0, rank)
        engine.enqueue(features, weights)
        acts = engine.dequeue()
        grads = {k: torch.ones_like(v) for k, v in acts.items()}
        if rank == 1:
            grads["a1"] = grads["a1"] * float("nan")
        try:
            engine.apply_gradients(grads)
            out[f"nan_{mode}"] = None
        except (ValueError, RuntimeError) as error:
            out[f"nan_{mode}"] = f"{type(error).__name__}: {error}"
        out[f"unchanged_{mode}"] = all(
            torch.equal(before[k], v) for k, v in final_state(engine)["tables"].items()
        )
        out[f"skipped_{mode}"] = engine.skipped_steps
    # A gradient of the wrong shape on one rank: every rank raises, the batch stays pending,
    # and a valid apply on every rank then goes through.
    engine = ec.EmbeddingEngine(feature_config(), ec_optimizer(case), plan=case.plan())
    engine.enqueue(features, weights)
    acts = engine.dequeue()
    wrong = {k: torch.ones_like(v) for k, v in acts.items()}
    if rank == 0:
        wrong["b"] = torch.ones(1, 5)
    try:
        engine.apply_gradients(wrong)
        out["bad_shape"] = None
    except (ValueError, RuntimeError) as error:
        out["bad_shape"] = f"{type(error).__name__}: {error}"
    engine.apply_gradients({k: torch.ones_like(v) for k, v in acts.items()})
    out["step_after_retry"] = engine.step
    # Ranks that build different engines are told so, instead of hanging later.
    try:
        ec.EmbeddingEngine(feature_config(), ec.SGD(learning_rate=0.1), seed=rank)
        out["mismatch"] = None
    except ValueError as error:
        out["mismatch"] = str(error)
    try:
        other = Case("table_wise", "sgd", world + 1).plan()
        ec.EmbeddingEngine(feature_config(), ec.SGD(learning_rate=0.1), plan=other)
        out["world_mismatch"] = None
    except ValueError as error:
        out["world_mismatch"] = str(error)
    return out


def statistics_plans(world: int) -> dict[str, ShardingPlan]:
    """Two plans that between them put every table under every scheme (row-wise on
    reversed ranks, so shard p is not rank p)."""
    every = list(range(world))
    return {
        "mixed": ShardingPlan(
            world_size=world,
            tables={
                "a": TableShard.row_wise(list(reversed(every)), "mod"),
                "b": TableShard.data_parallel(world),
                "c": TableShard.column_wise(every, 6),
            },
        ),
        "other": ShardingPlan(
            world_size=world,
            tables={
                "a": TableShard.table_wise(world - 1),
                "b": TableShard.row_wise(every, "div"),
                "c": TableShard.row_wise(list(reversed(every)), "div"),
            },
        ),
    }


def worker_statistics(rank: int, world: int, directory: str) -> dict[str, list[str]]:
    """Train ``STEPS`` steps under each of :func:`statistics_plans`, profiling every batch."""
    case = Case("row_wise:div", "adagrad", world)  # the inputs only
    out = {}
    for name, plan in statistics_plans(world).items():
        engine = ec.EmbeddingEngine(
            feature_config(),
            ec_optimizer(case),
            plan=plan,
            profile_data_directory=os.path.join(directory, name),
            profile_sample_rate=1.0,
        )
        train(engine, case, [rank])
        out[name] = engine.write_statistics()
    return out


def _entry(rank: int, world: int, store: str, fn: str, args: tuple, out: str) -> None:
    warnings.simplefilter("error")  # as pytest's filterwarnings = error
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    try:
        module, _, name = fn.rpartition(":")  # "module:function" runs another module's
        target = getattr(importlib.import_module(module), name) if module else globals()[fn]
        result: Any = target(rank, world, *args)
    except BaseException:
        result = {"__error__": traceback.format_exc()}
    finally:
        dist.destroy_process_group()
    torch.save(result, os.path.join(out, f"{rank}.pt"))
    # The outcome is on disk: leave without the interpreter's teardown, where gloo's threads
    # occasionally abort a loaded machine's process after everything under test has finished.
    os._exit(0)


_PRELOADED = False


def launch(fn: str, world: int, *args: Any) -> list[Any]:
    """Run ``fn(rank, world, *args)`` (a function of this module, or ``"module:function"``)
    on ``world`` gloo ranks."""
    global _PRELOADED
    ctx = mp.get_context("forkserver")
    if not _PRELOADED:
        ctx.set_forkserver_preload(
            ["torch", "torch.distributed", "embcore", "embcore.checkpoint", "sharding_harness"]
        )
        _PRELOADED = True
    with tempfile.TemporaryDirectory() as tmp:
        store = os.path.join(tmp, "store")
        mp.start_processes(
            _entry,
            args=(world, store, fn, args, tmp),
            nprocs=world,
            join=True,
            start_method="forkserver",
        )
        results = [
            torch.load(os.path.join(tmp, f"{r}.pt"), weights_only=False) for r in range(world)
        ]
    errors = [r["__error__"] for r in results if isinstance(r, dict) and "__error__" in r]
    if errors:
        raise RuntimeError("a rank failed:\n" + "\n".join(errors))
    return results
