"""Engines drawn across the axes that interact, run step by step beside the NumPy model.

A :class:`Combo` is one engine configuration: the optimizer and its options (a line of
``OPTIMIZER_CASES``), one to three tables (fixed or dynamic; combiner; dim; vocabulary and ids
per step on both sides of the CPU kernels' size thresholds: hashed or indexed dedup, one
thread or several, fused or unfused rule), per-id weights, admission and each eviction rule,
pipelining, ``torch.compile``, lookup statistics, the TPU-style or PyTorch-style API per step,
and one process or 2 gloo ranks with the plan's ranks in a drawn order.

:class:`Reference` is the independent model: ``numpy_reference`` for lookups and optimizer
updates, ``dynamic_model.Model`` for a dynamic table's keys (admission, eviction), rows kept
per key. It follows the documented pipelining (docs/semantics.md §4.5, docs/dynamic_tables.md
"Pipelining"): one step stale unless a dynamic table evicts; a save or ``flush`` drains.
Every table has two features; rank ``r``'s batch of a step depends on (seed, step, r) only,
and one process trains on the ranks' batches concatenated in rank order.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy_reference as ref
import torch
from dynamic_model import Model
from engine_cases import OptCase, initializer_from, table_values

import embcore as ec
from embcore.dynamic.init import default_rows
from embcore.sharding import ShardingPlan, TableShard

#: raw 64-bit keys of the dynamic tables (drawn Zipf-like: a few hot keys, a long tail)
POOL = np.array(
    [-(2**63), 2**63 - 1, -1, 0, 1, *[(i * 0x9E3779B97F4A7C15) % 2**63 - 2**62 for i in range(35)]],
    dtype=np.int64,
)
RTOL, ATOL = 2e-4, 2e-5


@dataclass(frozen=True)
class TableSpec:
    """One table: ``vocab=None`` makes it dynamic; ``ids``: ids per rank and step over its
    two features; ``scheme``: its placement when sharded (dynamic tables: key hash)."""

    name: str
    vocab: int | None
    dim: int
    combiner: str
    ids: int
    min_count: int = 1
    ttl: int | None = None
    cap: int | None = None
    scheme: str = "row_wise:div"

    @property
    def dynamic(self) -> bool:
        return self.vocab is None

    @property
    def evicting(self) -> bool:
        return self.dynamic and (self.ttl is not None or self.cap is not None)

    @property
    def features(self) -> tuple[str, str]:
        return (f"{self.name}_x", f"{self.name}_y")

    def initial(self, seed: int) -> np.ndarray:
        assert self.vocab is not None
        return table_values(np.random.default_rng([seed, len(self.name)]), self.vocab, self.dim)

    def config(self, seed: int) -> ec.TableConfig:
        if self.dynamic:
            admission = ec.CountAdmission(min_count=self.min_count) if self.min_count > 1 else None
            eviction = None
            if self.evicting:
                eviction = ec.Eviction(steps_to_live=self.ttl, max_rows=self.cap)
            return ec.TableConfig(
                None, self.dim, name=self.name, combiner=self.combiner,
                admission=admission, eviction=eviction,
            )  # fmt: skip
        init = initializer_from(self.initial(seed))
        return ec.TableConfig(
            self.vocab, self.dim, name=self.name, combiner=self.combiner, initializer=init
        )

    def shard(self, ranks: tuple[int, ...]) -> TableShard:
        if self.dynamic:
            return TableShard(scheme="key_hash", ranks=ranks)
        scheme, _, strategy = self.scheme.partition(":")
        if scheme == "table_wise":
            return TableShard.table_wise(ranks[0])
        if scheme == "column_wise":
            return TableShard.column_wise(list(ranks), self.dim)
        if scheme == "data_parallel":
            return TableShard.data_parallel(len(ranks))
        return TableShard.row_wise(list(ranks), strategy)


@dataclass(frozen=True)
class Combo:
    """One drawn engine and its run (see the module docstring)."""

    optimizer: OptCase
    tables: tuple[TableSpec, ...]
    weighted: bool
    pipeline: bool
    compiled: bool
    stats: bool
    tpu_style: tuple[bool, ...]  # per step: enqueue / dequeue / apply_gradients
    ranks: tuple[int, ...] | None  # the plan's order of 2 gloo ranks; None: one process
    threads: int
    seed: int

    @property
    def steps(self) -> int:
        return len(self.tpu_style)

    @property
    def world(self) -> int:
        return 1 if self.ranks is None else len(self.ranks)

    @property
    def stale(self) -> bool:
        """Pipelined and one step stale: no dynamic table evicts."""
        return self.pipeline and not any(t.evicting for t in self.tables)

    def features(self) -> dict[str, ec.FeatureConfig]:
        out = {}
        for t in self.tables:
            config = t.config(self.seed)
            for name in t.features:
                out[name] = ec.FeatureConfig(config)
        return out

    def plan(self, world: int) -> ShardingPlan | None:
        if world == 1 or self.ranks is None:
            return None
        return ShardingPlan(
            world_size=world, tables={t.name: t.shard(self.ranks) for t in self.tables}
        )

    def engine(self, world: int = 1, stats_dir: str | None = None) -> ec.EmbeddingEngine:
        options: dict[str, Any] = {"seed": self.seed, "pipeline": self.pipeline}
        if stats_dir is not None:
            options |= {"profile_data_directory": stats_dir, "profile_sample_rate": 1.0}
        return ec.EmbeddingEngine(
            self.features(), self.optimizer.make(), plan=self.plan(world), **options
        )


# ------------------------------------------------------------------------------ batches


def local_batch(combo: Combo, step: int, rank: int) -> dict[str, list[ref.Sample]]:
    """Rank ``rank``'s samples of ``step`` per feature: 2 to 6 samples (the same for every
    feature), bags of about ``ids / 2 / samples`` ids (0 included), duplicates, hot ids."""
    batch = int(np.random.default_rng([combo.seed, step, rank]).integers(2, 7))
    out = {}
    for i, t in enumerate(combo.tables):
        for j, name in enumerate(t.features):
            rng = np.random.default_rng([combo.seed, step, rank, i, j])
            mean = max(1, t.ids // 2 // batch)
            rows = []
            for n in rng.integers(0, 2 * mean + 1, size=batch).tolist():
                if t.dynamic:
                    ids = POOL[np.minimum(rng.zipf(1.4, size=n) - 1, POOL.size - 1)]
                else:
                    hot = rng.integers(min(t.vocab, 8), size=n)
                    ids = np.where(rng.random(n) < 0.4, hot, rng.integers(t.vocab, size=n))
                w = rng.uniform(0.25, 2.0, size=n).astype(np.float32)
                rows.append([(int(k), float(w[m]) if combo.weighted else 1.0)
                             for m, k in enumerate(ids)])  # fmt: skip
            out[name] = rows
    return out


def local_gradients(combo: Combo, step: int, rank: int, batch: dict) -> dict[str, np.ndarray]:
    out = {}
    for i, t in enumerate(combo.tables):
        for j, name in enumerate(t.features):
            rng = np.random.default_rng([combo.seed, step, rank, i, j, 99])
            out[name] = rng.standard_normal((len(batch[name]), t.dim)).astype(np.float32)
    return out


def global_batch(combo: Combo, step: int) -> tuple[dict, dict]:
    """Every rank's samples and gradients, concatenated in rank order."""
    samples: dict[str, list] = {}
    grads: dict[str, list] = {}
    for rank in range(combo.world):
        batch = local_batch(combo, step, rank)
        g = local_gradients(combo, step, rank, batch)
        for name in batch:
            samples.setdefault(name, []).extend(batch[name])
            grads.setdefault(name, []).append(g[name])
    return samples, {k: np.concatenate(v) for k, v in grads.items()}


def engine_inputs(batch: dict[str, list[ref.Sample]], weighted: bool) -> tuple[dict, Any]:
    ids, weights = {}, {}
    for name, rows in batch.items():
        ids[name] = ec.RaggedIds.from_lists([[k for k, _ in r] for r in rows], dtype=torch.int64)
        weights[name] = ec.RaggedIds.from_lists(
            [[w for _, w in r] for r in rows], dtype=torch.float32
        )
    return ids, (weights if weighted else None)


class Runner:
    """Drives one engine through steps in the drawn API style, compiled or not."""

    def __init__(self, combo: Combo, engine: ec.EmbeddingEngine) -> None:
        self.combo, self.engine = combo, engine
        self.forward: Any = engine
        if combo.compiled:
            self.forward = torch.compile(engine, backend="aot_eager", fullgraph=True)

    def step(self, step: int, batch: dict, grads: dict) -> dict[str, np.ndarray]:
        ids, weights = engine_inputs(batch, self.combo.weighted)
        g = {k: torch.from_numpy(v) for k, v in grads.items()}
        if self.combo.tpu_style[step]:
            self.engine.enqueue(ids, weights=weights)
            acts = self.engine.dequeue()
            self.engine.apply_gradients(g)
        else:
            inputs = self.engine.prepare(ids, weights) if self.combo.compiled else ids
            acts = self.forward(inputs) if self.combo.compiled else self.forward(ids, weights)
            sum((acts[k] * g[k]).sum() for k in acts).backward()
        return {k: v.detach().numpy().copy() for k, v in acts.items()}


# ---------------------------------------------------------------------------- the model


class Reference:
    """The NumPy model of a combo's engine (one process on the global batches)."""

    def __init__(self, combo: Combo) -> None:
        self.combo = combo
        opt = combo.optimizer
        self.kind, self.hp = opt.kind, opt.hp
        self.lr = float(opt.hp["learning_rate"])
        self.tables: dict[str, np.ndarray] = {}
        self.slots: dict[str, dict[str, np.ndarray]] = {}
        self.models: dict[str, Model] = {}
        self.rows: dict[str, dict[int, tuple[np.ndarray, dict[str, np.ndarray]]]] = {}
        for t in combo.tables:
            if t.dynamic:
                self.models[t.name] = Model(t.min_count, t.ttl, t.cap)
                self.rows[t.name] = {}
            else:
                self.tables[t.name] = t.initial(combo.seed).astype(np.float64)
                self.slots[t.name] = ref.initial_slots(self.kind, self.hp, t.vocab, t.dim)
        self.deferred: tuple | None = None
        self.step = 0  # updates applied

    # a dynamic table as a dense array: its held keys (ascending), then one zero row that
    # every key without a row reads
    def _dense(self, t: TableSpec) -> tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]]:
        keys = np.array(sorted(self.rows[t.name]), dtype=np.int64)
        table = np.zeros((keys.size + 1, t.dim))
        slots = ref.initial_slots(self.kind, self.hp, keys.size + 1, t.dim)
        for i, k in enumerate(keys.tolist()):
            w, s = self.rows[t.name][k]
            table[i] = w
            for name, value in s.items():
                slots[name][i] = value
        return keys, table, slots

    def _indexed(self, keys: np.ndarray, samples: list, held: set[int]) -> list:
        where = {int(k): i for i, k in enumerate(keys.tolist())}
        return [[(where[k] if k in held else keys.size, w) for k, w in s] for s in samples]

    def lookup(self, samples: dict[str, list]) -> tuple[dict[str, np.ndarray], dict[str, set]]:
        """A training lookup: activations per feature, and each dynamic table's keys that
        held a row at this lookup (only their gradients are applied)."""
        acts, held = {}, {}
        for t in self.combo.tables:
            if not t.dynamic:
                for name in t.features:
                    acts[name] = ref.lookup(self.tables[t.name], samples[name], t.combiner)
                continue
            model = self.models[t.name]
            model.lookup([k for name in t.features for s in samples[name] for k, _ in s])
            fresh = sorted(set(model.held) - set(self.rows[t.name]))
            if fresh:
                start = default_rows(self.combo.seed, t.name, np.array(fresh, np.int64), t.dim)
                for k, row in zip(fresh, start.astype(np.float64), strict=True):
                    first = ref.initial_slots(self.kind, self.hp, 1, t.dim)
                    self.rows[t.name][k] = (row, {n: v[0] for n, v in first.items()})
            held[t.name] = set(model.held)
            keys, table, _ = self._dense(t)
            for name in t.features:
                indexed = self._indexed(keys, samples[name], held[t.name])
                acts[name] = ref.lookup(table, indexed, t.combiner)
        if self.deferred is not None:  # stale: the previous update lands after this lookup
            self._apply(*self.deferred)
            self.deferred = None
        return acts, held

    def update(self, samples: dict, grads: dict, held: dict[str, set]) -> None:
        if self.combo.stale:
            self.flush()
            self.deferred = (samples, grads, held)
        else:
            self._apply(samples, grads, held)

    def flush(self) -> None:
        if self.deferred is not None:
            self._apply(*self.deferred)
            self.deferred = None

    def _apply(self, samples: dict, grads: dict, held: dict[str, set]) -> None:
        self.step += 1
        for t in self.combo.tables:
            feats = [(samples[n], t.combiner, grads[n]) for n in t.features]
            if not t.dynamic:
                g, touched = ref.row_gradients(t.vocab, t.dim, feats)
                table, slots = self.tables[t.name], self.slots[t.name]
                ref.apply_update(self.kind, self.hp, table, slots, g, touched, self.lr, self.step)
                continue
            keys, table, slots = self._dense(t)
            feats = [(self._indexed(keys, s, held[t.name]), c, g) for s, c, g in feats]
            g, touched = ref.row_gradients(keys.size + 1, t.dim, feats)
            touched[keys.size] = False  # keys without a row: their gradients are dropped
            ref.apply_update(self.kind, self.hp, table, slots, g, touched, self.lr, self.step)
            for i, k in enumerate(keys.tolist()):
                self.rows[t.name][k] = (table[i], {n: v[i] for n, v in slots.items()})
            model = self.models[t.name]
            model.update({})  # the step boundary: eviction
            for k in set(self.rows[t.name]) - set(model.held):
                del self.rows[t.name][k]


# ---------------------------------------------------------------------------- checks


def close(got: Any, want: Any, what: str) -> None:
    """float32 results against the float64 model: ``RTOL``, and ``ATOL`` scaled by the
    array's largest magnitude (a row summing a thousand gradients of a big batch carries
    float32 rounding of that size into its small entries)."""
    want = np.asarray(want, dtype=np.float64)
    scale = max(1.0, float(np.abs(want).max())) if want.size else 1.0
    np.testing.assert_allclose(np.asarray(got), want, rtol=RTOL, atol=ATOL * scale, err_msg=what)


def check_acts(got: dict[str, np.ndarray], want: dict[str, np.ndarray], what: str) -> None:
    assert got.keys() == want.keys(), what
    for name, value in want.items():
        close(got[name], value, f"{what} {name}")


def check_state(engine: ec.EmbeddingEngine, model: Reference, what: str) -> None:
    """Every table and slot (fixed tables whole; dynamic tables: keys, rows, slots, pending)."""
    engine.flush()
    model.flush()
    tables, slots = engine.embedding_tables, engine.slot_variables
    for t in model.combo.tables:
        where = f"{what}: table {t.name}"
        if t.dynamic:
            keys = sorted(model.rows[t.name])
            assert engine.table_keys(t.name).tolist() == keys, where
            want_w = np.array([model.rows[t.name][k][0] for k in keys]).reshape(-1, t.dim)
            close(tables[t.name].numpy(), want_w, where)
            for name, value in slots[t.name].items():
                want = np.array([model.rows[t.name][k][1][name] for k in keys])
                close(value.numpy(), want.reshape(value.shape), f"{where} {name}")
            assert engine.table_info(t.name)["pending"] == len(model.models[t.name].pending), where
        else:
            close(tables[t.name].numpy(), model.tables[t.name], where)
            for name, value in slots[t.name].items():
                close(value.numpy(), model.slots[t.name][name], f"{where} {name}")


def read_stats(directory: str) -> dict[str, dict]:
    return {
        d["table"]: d for d in (json.loads(p.read_text()) for p in Path(directory).glob("*.json"))
    }


def expected_stats(combo: Combo, steps: range) -> dict[str, tuple[int, int]]:
    """``{table: (examples, ids)}`` over ``steps`` of every rank's batches."""
    out = {}
    for t in combo.tables:
        examples = ids = 0
        for step in steps:
            samples, _ = global_batch(combo, step)
            examples += len(samples[t.features[0]])
            ids += sum(len(s) for n in t.features for s in samples[n])
        out[t.name] = (examples, ids)
    return out


def check_stats(directory: str, combo: Combo, steps: range) -> None:
    found = read_stats(directory)
    for table, (examples, ids) in expected_stats(combo, steps).items():
        assert (found[table]["examples"], found[table]["ids"]) == (examples, ids), table


# --------------------------------------------------------------------------- one process


def run_one_process(combo: Combo) -> None:
    """Every step against the model; after the middle step a full save, one more step, a
    delta on it, and the rest of the run on a fresh engine that loaded the delta."""
    model = Reference(combo)
    half = combo.steps // 2
    with tempfile.TemporaryDirectory() as tmp:
        stats = os.path.join(tmp, "stats") if combo.stats else None
        runner = Runner(combo, combo.engine(stats_dir=stats))
        for step in range(combo.steps):
            samples, grads = global_batch(combo, step)
            want, held = model.lookup(samples)
            got = runner.step(step, samples, grads)
            check_acts(got, want, f"step {step}")
            model.update(samples, grads, held)
            if step == half - 1:
                ec.checkpoint.save(runner.engine, os.path.join(tmp, "full"))
                model.flush()  # a save drains the pipeline
            if step == half:
                ec.checkpoint.save(
                    runner.engine, os.path.join(tmp, "delta"), base=os.path.join(tmp, "full")
                )
                model.flush()
                check_state(runner.engine, model, f"saved after step {step}")
                if stats is not None:
                    runner.engine.write_statistics()
                    check_stats(stats, combo, range(step + 1))
                fresh = combo.engine()
                ec.checkpoint.load(fresh, os.path.join(tmp, "delta"))
                check_state(fresh, model, f"loaded after step {step}")
                runner = Runner(combo, fresh)
        check_state(runner.engine, model, "the end")


# ------------------------------------------------------------------------------ 2 ranks


def worker(rank: int, world: int, combo: Combo, tmp: str) -> dict[str, Any]:
    """Load the one-process checkpoint (1 -> 2), train the second half on this rank's
    batches, with a full save after its first step and a delta on it at the end (2 ranks
    write both), write the statistics."""
    stats = os.path.join(tmp, "stats") if combo.stats else None
    engine = combo.engine(world, stats_dir=stats)
    ec.checkpoint.load(engine, os.path.join(tmp, "full"))
    runner = Runner(combo, engine)
    acts = []
    for step in range(combo.steps // 2, combo.steps):
        batch = local_batch(combo, step, rank)
        acts.append(runner.step(step, batch, local_gradients(combo, step, rank, batch)))
        if step == combo.steps // 2:
            ec.checkpoint.save(engine, os.path.join(tmp, "mid"))
    ec.checkpoint.save(engine, os.path.join(tmp, "end"), base=os.path.join(tmp, "mid"))
    # a delta of the ranks on the base one process saved (loaded above)
    ec.checkpoint.save(engine, os.path.join(tmp, "end1"), base=os.path.join(tmp, "full"))
    if stats is not None:
        engine.write_statistics()
    return {"acts": acts}


def run_sharded(combo: Combo, tmp: str, launch: Any) -> None:
    """The first half in one process, then a full save; the second half on 2 ranks that
    loaded it (a full save and a delta on it); one process loads the delta (2 -> 1). Every
    step against the model; and a delta the ranks saved on the one-process base loads in
    one process too (1 -> 2 -> 1 through a delta)."""
    model = Reference(combo)
    half = combo.steps // 2
    runner = Runner(combo, combo.engine())
    for step in range(half):
        samples, grads = global_batch(combo, step)
        want, held = model.lookup(samples)
        check_acts(runner.step(step, samples, grads), want, f"step {step}")
        model.update(samples, grads, held)
    ec.checkpoint.save(runner.engine, os.path.join(tmp, "full"))
    model.flush()
    ranks = launch("combination_cases:worker", combo.world, combo, tmp)
    for i, step in enumerate(range(half, combo.steps)):
        samples, grads = global_batch(combo, step)
        want, held = model.lookup(samples)
        model.update(samples, grads, held)
        if step == half:
            model.flush()  # the ranks' full save drains the pipeline
        offset = dict.fromkeys(want, 0)
        for rank in range(combo.world):  # rank r's samples follow those of ranks < r
            mine = {}
            for name, rows in local_batch(combo, step, rank).items():
                mine[name] = want[name][offset[name] : offset[name] + len(rows)]
                offset[name] += len(rows)
            check_acts(ranks[rank]["acts"][i], mine, f"rank {rank} step {step}")
    for name in ("end", "end1"):
        fresh = combo.engine()
        ec.checkpoint.load(fresh, os.path.join(tmp, name))
        check_state(fresh, model, f"loaded from 2 ranks at the end ({name})")
    if combo.stats:
        check_stats(os.path.join(tmp, "stats"), combo, range(half, combo.steps))


# ---------------------------------------------------------------------------- coverage

#: the values each axis must take over a profile's draws (test_the_draws_reach_every_axis)
AXES: dict[str, tuple] = {
    "kind": ("sgd", "adagrad", "adagrad_momentum", "adam", "ftrl", "rowwise_adagrad"),
    "table": ("fixed", "dynamic"),
    "eviction": ("none", "ttl", "cap", "both"),
    "admission": ("first sight", "counted"),
    "combiner": ("sum", "mean", "sqrtn"),
    "ids": ("one thread", "threads"),
    "dedup": ("hashed", "index"),
    "rule": ("fused", "unfused"),
    "weighted": (False, True),
    "pipeline": ("off", "stale", "drained"),
    "compiled": (False, True),
    "stats": (False, True),
    "api": ("tpu", "torch"),
    "threads": (1, 2),
}


def axes(combo: Combo) -> dict[str, set]:
    """The values a combo gives each axis of :data:`AXES`."""
    from embcore._numba.threads import MIN_WORK_PER_THREAD
    from embcore.ops.cpu import FUSE_BYTES
    from embcore.ops.cpu.dedup import HASH_SLOTS
    from embcore.ops.cpu.rules import RULES

    opt = combo.optimizer.make()
    fused = getattr(RULES[type(opt)], "fused", None) is not None and opt.lazy
    out: dict[str, set] = {
        "kind": {combo.optimizer.kind},
        "weighted": {combo.weighted},
        "pipeline": {"off" if not combo.pipeline else "stale" if combo.stale else "drained"},
        "compiled": {combo.compiled},
        "stats": {combo.stats},
        "api": {"tpu" if s else "torch" for s in combo.tpu_style},
        "threads": {combo.threads},
        "ids": {"threads" if sum(t.ids for t in combo.tables) >= MIN_WORK_PER_THREAD
                else "one thread"},
    }  # fmt: skip
    for t in combo.tables:
        out.setdefault("table", set()).add("dynamic" if t.dynamic else "fixed")
        out.setdefault("combiner", set()).add(t.combiner)
        if t.dynamic:
            kind = {(False, False): "none", (True, False): "ttl", (False, True): "cap"}
            evict = kind.get((t.ttl is not None, t.cap is not None), "both")
            out.setdefault("eviction", set()).add(evict)
            out.setdefault("admission", set()).add("counted" if t.min_count > 1 else "first sight")
            continue
        slots = 1 << max(1, math.ceil(math.log2(2 * max(t.ids, 1))))
        hashed = slots <= HASH_SLOTS and 12 * slots < 4 * t.vocab
        out.setdefault("dedup", set()).add("hashed" if hashed else "index")
        if fused:
            out.setdefault("rule", set()).add(
                "fused" if 4 * t.ids * t.dim <= FUSE_BYTES else "unfused"
            )
    return out
