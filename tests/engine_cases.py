"""Shared test material: the optimizer conformance list and builders of engine inputs.

Every input is generated as NumPy-side samples (see :mod:`numpy_reference`) and then turned into
the engine's input formats, so the reference and the engine read the same ids and weights.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from numpy_reference import Sample

import embcore as ec
import embcore.ops as ec_ops

# --------------------------------------------------------------------- optimizer conformance

OPTIMIZER_CLASSES: dict[str, Callable[..., ec.Optimizer]] = {
    "sgd": ec.SGD,
    "adagrad": ec.Adagrad,
    "adagrad_momentum": ec.AdagradMomentum,
    "adam": ec.Adam,
    "ftrl": ec.FTRL,
    "rowwise_adagrad": ec.RowwiseAdagrad,
}


@dataclass(frozen=True)
class OptCase:
    """One optimizer configuration: ``kind`` names the NumPy model, ``hp`` the keyword args."""

    id: str
    kind: str
    hp: dict[str, Any]

    def make(self, **override: Any) -> ec.Optimizer:
        return OPTIMIZER_CLASSES[self.kind](**{**self.hp, **override})


#: Adding an optimizer or an option adds one line here; every shared test then covers it.
OPTIMIZER_CASES: list[OptCase] = [
    OptCase("sgd", "sgd", {"learning_rate": 0.1}),
    OptCase(
        "sgd-clip-decay",
        "sgd",
        {"learning_rate": 0.1, "clipvalue": 0.3, "weight_decay_factor": 0.05},
    ),
    OptCase(
        "sgd-cliplist-decay-by-lr-wclip",
        "sgd",
        {
            "learning_rate": 0.2,
            "clipvalue": [-0.1, 0.4],
            "weight_decay_factor": 0.5,
            "multiply_weight_decay_factor_by_learning_rate": True,
            "clip_weight_min": -0.35,
            "clip_weight_max": 0.3,
        },
    ),
    OptCase("adagrad", "adagrad", {"learning_rate": 0.1}),
    OptCase(
        "adagrad-init-clipmax-wclip",
        "adagrad",
        {
            "learning_rate": 0.2,
            "initial_accumulator_value": 0.5,
            "clipvalue": (None, 0.2),
            "clip_weight_min": -0.3,
            "clip_weight_max": 0.25,
        },
    ),
    OptCase(
        "adagrad-decay-by-lr",
        "adagrad",
        {
            "learning_rate": 0.1,
            "weight_decay_factor": 0.5,
            "multiply_weight_decay_factor_by_learning_rate": True,
        },
    ),
    OptCase("adagrad_momentum", "adagrad_momentum", {"learning_rate": 0.1, "momentum": 0.9}),
    OptCase(
        "adagrad_momentum-nesterov",
        "adagrad_momentum",
        {"learning_rate": 0.05, "momentum": 0.5, "use_nesterov": True},
    ),
    OptCase(
        "adagrad_momentum-nesterov-beta2-exp3",
        "adagrad_momentum",
        {
            "learning_rate": 0.05,
            "momentum": 0.8,
            "use_nesterov": True,
            "beta2": 0.9,
            "exponent": 3.0,
            "epsilon": 1e-6,
        },
    ),
    OptCase(
        "adagrad_momentum-beta2-exp4-cliplow",
        "adagrad_momentum",
        {
            "learning_rate": 0.05,
            "momentum": 0.7,
            "beta2": 0.95,
            "exponent": 4,
            "clipvalue": (-0.2, None),
        },
    ),
    OptCase("adam", "adam", {"learning_rate": 0.05}),
    OptCase(
        "adam-eps-outside-sqrt",
        "adam",
        {
            "learning_rate": 0.05,
            "beta_1": 0.8,
            "beta_2": 0.99,
            "epsilon": 1e-3,
            "sum_inside_sqrt": False,
        },
    ),
    OptCase("adam-non-lazy", "adam", {"learning_rate": 0.05, "lazy_adam": False}),
    OptCase(
        "adam-non-lazy-eps-outside-sqrt",
        "adam",
        {"learning_rate": 0.05, "lazy_adam": False, "sum_inside_sqrt": False, "epsilon": 1e-4},
    ),
    OptCase(
        # every row is updated, so every row decays and is clipped (docs/semantics.md §3.6 +
        # §3.11/§3.12)
        "adam-non-lazy-decay-wclip",
        "adam",
        {
            "learning_rate": 0.05,
            "lazy_adam": False,
            "weight_decay_factor": 0.1,
            "clip_weight_min": -0.4,
        },
    ),
    OptCase("adam-bias-correction", "adam", {"learning_rate": 0.05, "bias_correction": True}),
    OptCase(
        "adam-eps-outside-sqrt-bias-correction",
        "adam",
        {"learning_rate": 0.1, "sum_inside_sqrt": False, "bias_correction": True},
    ),
    OptCase(
        "adam-decay-clip",
        "adam",
        {
            "learning_rate": 0.05,
            "weight_decay_factor": 0.1,
            "clip_weight_max": 0.2,
            "clipvalue": [-0.5, 0.5],
        },
    ),
    OptCase("ftrl", "ftrl", {"learning_rate": 0.1}),
    OptCase(
        "ftrl-l1-l2-beta-power",
        "ftrl",
        {
            "learning_rate": 0.1,
            "learning_rate_power": -0.6,
            "l1_regularization_strength": 0.05,
            "l2_regularization_strength": 0.1,
            "beta": 0.3,
        },
    ),
    OptCase(
        "ftrl-multiply-linear",
        "ftrl",
        {
            "learning_rate": 0.1,
            "multiply_linear_by_learning_rate": True,
            "l1_regularization_strength": 0.05,
            "l2_regularization_strength": 0.1,
            "beta": 0.3,
        },
    ),
    OptCase(
        "ftrl-zero-accumulator-l1",
        "ftrl",
        {
            "learning_rate": 0.1,
            "initial_accumulator_value": 0.0,
            "l1_regularization_strength": 0.01,
        },
    ),
    OptCase(
        "ftrl-multiply-linear-zero-accumulator",
        "ftrl",
        {
            "learning_rate": 0.1,
            "multiply_linear_by_learning_rate": True,
            "initial_accumulator_value": 0.0,
            "learning_rate_power": -0.3,
        },
    ),
    OptCase(
        "ftrl-decay-wclip",
        "ftrl",
        {
            "learning_rate": 0.1,
            "weight_decay_factor": 0.2,
            "multiply_weight_decay_factor_by_learning_rate": True,
            "clip_weight_min": -0.05,
        },
    ),
    OptCase("rowwise_adagrad", "rowwise_adagrad", {"learning_rate": 0.1}),
    OptCase(
        "rowwise_adagrad-zero-init-eps-clip-decay",
        "rowwise_adagrad",
        {
            "learning_rate": 0.1,
            "initial_accumulator_value": 0.0,
            "epsilon": 1e-3,
            "clipvalue": 0.5,
            "weight_decay_factor": 0.1,
        },
    ),
]

OPTIMIZER_IDS = [c.id for c in OPTIMIZER_CASES]


# ---------------------------------------------------------------------------- tables


def table_values(rng: np.random.Generator, vocab: int, dim: int) -> np.ndarray:
    """Random float32 initial values in [-0.5, 0.5)."""
    return (rng.random((vocab, dim)) - 0.5).astype(np.float32)


def initializer_from(values: np.ndarray) -> Callable[..., torch.Tensor]:
    """A TableConfig initializer returning a copy of ``values``, checking how it is called."""

    def init(shape: Sequence[int], dtype: torch.dtype = torch.float32) -> torch.Tensor:
        assert tuple(shape) == values.shape, (shape, values.shape)
        assert dtype == torch.float32
        return torch.from_numpy(values.copy())

    return init


# ---------------------------------------------------------------------------- inputs


def dense_samples(ids: np.ndarray) -> list[Sample]:
    """One sample per id, weight 1, in row-major order."""
    return [[(int(i), 1.0)] for i in np.asarray(ids).reshape(-1)]


def ragged_input(
    rows: Sequence[Sample], weighted: bool = True
) -> tuple[ec.RaggedIds, ec.RaggedIds | None]:
    """RaggedIds ids (and float32 weights) from rows of ``(id, weight)``."""
    ids = ec.RaggedIds.from_lists([[i for i, _ in r] for r in rows], dtype=torch.int64)
    if not weighted:
        return ids, None
    weights = ec.RaggedIds.from_lists([[w for _, w in r] for r in rows], dtype=torch.float32)
    return ids, weights


def ragged_samples(rows: Sequence[Sample], weighted: bool = True) -> list[Sample]:
    return [[(i, w if weighted else 1.0) for i, w in r] for r in rows]


def ragged_sequence_samples(rows: Sequence[Sample], length: int) -> list[Sample]:
    """docs/semantics.md §2.4: position p < L of row b is sample ``b*L + p``; weights play no part
    here."""
    out: list[Sample] = []
    for r in rows:
        for p in range(length):
            out.append([(r[p][0], 1.0)] if p < len(r) else [])
    return out


Entry = tuple[tuple[int, ...], int, float]
"""One sparse entry: ``(index, id, weight)``."""


def sparse_input(
    entries: Sequence[Entry],
    dense_shape: Sequence[int],
    rng: np.random.Generator | None = None,
    weighted: bool = True,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Uncoalesced ``sparse_coo_tensor`` ids and weights, entries in a shuffled order."""
    order = np.arange(len(entries))
    if rng is not None:
        rng.shuffle(order)
    rank = len(dense_shape)
    index = torch.tensor(
        [[entries[k][0][d] for k in order] for d in range(rank)], dtype=torch.int64
    ).reshape(rank, len(entries))
    ids = torch.sparse_coo_tensor(
        index,
        torch.tensor([entries[k][1] for k in order], dtype=torch.int64),
        tuple(dense_shape),
        check_invariants=True,
    )
    if not weighted:
        return ids, None
    weights = torch.sparse_coo_tensor(
        index,
        torch.tensor([entries[k][2] for k in order], dtype=torch.float32),
        tuple(dense_shape),
        check_invariants=True,
    )
    return ids, weights


def sparse_samples(
    entries: Sequence[Entry], dense_shape: Sequence[int], weighted: bool = True
) -> list[Sample]:
    """docs/semantics.md §2.2: entries sharing all but the last index form one sample
    (row-major)."""
    outer = tuple(dense_shape[:-1])
    out: list[Sample] = [[] for _ in range(int(np.prod(outer)))]
    for index, i, w in entries:
        out[int(np.ravel_multi_index(index[:-1], outer))].append((i, w if weighted else 1.0))
    return out


def sparse_sequence_samples(entries: Sequence[Entry], batch: int, length: int) -> list[Sample]:
    """docs/semantics.md §2.4: ``(row, col)`` with ``col < L`` is sample ``row*L + col``; duplicates
    add up."""
    out: list[Sample] = [[] for _ in range(batch * length)]
    for (row, col), i, _ in entries:
        if col < length:
            out[row * length + col].append((i, 1.0))
    return out


# ----------------------------------------------------------------- the shared scenario
#
# Two tables, four features in a nested structure, shared tables and a sequence feature:
#
#   {"item": (sparse weighted on A, dense (B, 1) on B),
#    "user": [ragged weighted on A, sparse sequence L=3 on B]}
#
# Ids stay below 8 on A and below 7 on B, except that B's row 8 appears only in truncated
# sequence positions (col >= L): rows 8-10 of A and 7-8 of B are never touched.

VOCAB_A, DIM_A = 11, 5
VOCAB_B, DIM_B = 9, 13
SEQ_LEN = 3
A_IDS, B_IDS = 8, 7
B_TRUNCATED_ONLY = 8
FEATURE_PATHS: list[tuple[str, int]] = [("item", 0), ("item", 1), ("user", 0), ("user", 1)]
FEATURE_TABLE = {("item", 0): "a", ("item", 1): "b", ("user", 0): "a", ("user", 1): "b"}


def scenario_tables(
    rng: np.random.Generator, combiner_a: str = "sqrtn", combiner_b: str = "mean"
) -> tuple[ec.TableConfig, ec.TableConfig, dict[str, np.ndarray]]:
    values = {"a": table_values(rng, VOCAB_A, DIM_A), "b": table_values(rng, VOCAB_B, DIM_B)}
    ta = ec.TableConfig(
        VOCAB_A, DIM_A, initializer=initializer_from(values["a"]), combiner=combiner_a, name="a"
    )
    tb = ec.TableConfig(
        VOCAB_B, DIM_B, initializer=initializer_from(values["b"]), combiner=combiner_b, name="b"
    )
    return ta, tb, values


def scenario_features(ta: ec.TableConfig, tb: ec.TableConfig) -> dict[str, Any]:
    return {
        "item": (ec.FeatureConfig(ta), ec.FeatureConfig(tb)),
        "user": [ec.FeatureConfig(ta), ec.FeatureConfig(tb, max_sequence_length=SEQ_LEN)],
    }


@dataclass
class StepBatch:
    """One step of the scenario: engine inputs and the reference's view of them."""

    features: dict[str, Any]
    weights: dict[str, Any]
    samples: dict[tuple[str, int], list[Sample]]
    shapes: dict[tuple[str, int], tuple[int, ...]]

    def combiner(self, path: tuple[str, int], combiners: dict[str, str]) -> str:
        return "sum" if path == ("user", 1) else combiners[FEATURE_TABLE[path]]


def _weight(rng: np.random.Generator) -> float:
    return float(np.float32(rng.uniform(0.25, 2.0)))


def scenario_batch(
    rng: np.random.Generator, batch: int, ids_a: int = A_IDS, ids_b: int = B_IDS
) -> StepBatch:
    """A random batch of ``batch`` samples per feature, with duplicates and empty samples."""
    # item/0: sparse (B, 4) weighted on A; row 0 repeats an index, row B-1 stays empty.
    entries: list[Entry] = []
    for row in range(batch - 1):
        for col in rng.choice(4, size=int(rng.integers(1, 4)), replace=False):
            entries.append(((row, int(col)), int(rng.integers(ids_a)), _weight(rng)))
    first = next(e for e in entries if e[0][0] == 0)
    entries.append((first[0], int(rng.integers(ids_a)), _weight(rng)))  # duplicate index
    item_a, item_a_w = sparse_input(entries, (batch, 4), rng)
    # item/1: dense (B, 1) on B.
    dense = rng.integers(ids_b, size=(batch, 1))
    # user/0: ragged weighted on A; row 0 holds a duplicate id; row 1 is empty.
    rows: list[Sample] = []
    for row in range(batch):
        n = 0 if row == 1 else int(rng.integers(1, 4))
        rows.append([(int(rng.integers(ids_a)), _weight(rng)) for _ in range(n)])
    rows[0].append((rows[0][0][0], _weight(rng)))
    user_a, user_a_w = ragged_input(rows)
    # user/1: sparse sequence, dense_shape (B, 5); columns >= L only hold the truncated-only id.
    seq: list[Entry] = []
    for row in range(batch):
        for col in sorted(rng.choice(5, size=int(rng.integers(0, 4)), replace=False)):
            i = B_TRUNCATED_ONLY if col >= SEQ_LEN else int(rng.integers(ids_b))
            seq.append(((row, int(col)), i, 1.0))
    seq.append(((0, 5 - 1), B_TRUNCATED_ONLY, 1.0))
    user_b, _ = sparse_input(seq, (batch, 5), rng, weighted=False)
    return StepBatch(
        features={"item": (item_a, torch.from_numpy(dense)), "user": [user_a, user_b]},
        weights={"item": (item_a_w, None), "user": [user_a_w, None]},
        samples={
            ("item", 0): sparse_samples(entries, (batch, 4)),
            ("item", 1): dense_samples(dense),
            ("user", 0): ragged_samples(rows),
            ("user", 1): sparse_sequence_samples(seq, batch, SEQ_LEN),
        },
        shapes={
            ("item", 0): (batch,),
            ("item", 1): (batch,),
            ("user", 0): (batch,),
            ("user", 1): (batch, SEQ_LEN),
        },
    )


def get_path(structure: dict[str, Any], path: tuple[str, int]) -> Any:
    return structure[path[0]][path[1]]


def nested(values: dict[tuple[str, int], Any]) -> dict[str, Any]:
    """``{path: value}`` back into the scenario's structure (item a tuple, user a list)."""
    return {
        "item": (values[("item", 0)], values[("item", 1)]),
        "user": [values[("user", 0)], values[("user", 1)]],
    }


def random_gradients(
    rng: np.random.Generator, batch: StepBatch
) -> dict[tuple[str, int], torch.Tensor]:
    dims = {"a": DIM_A, "b": DIM_B}
    return {
        path: torch.from_numpy(
            rng.standard_normal((*batch.shapes[path], dims[FEATURE_TABLE[path]])).astype(np.float32)
        )
        for path in FEATURE_PATHS
    }


# --------------------------------------------------------------------------- backends


def _works_on_cpu(name: str) -> bool:
    table = ec.TableConfig(3, 2, name="probe")
    try:
        engine = ec.EmbeddingEngine(ec.FeatureConfig(table), ec.SGD(), backend=name)
        engine(torch.tensor([0, 2]))
    except (ImportError, NotImplementedError):
        return False
    return True


#: Every kernel backend that runs on this machine's CPU: each must match the NumPy model.
BACKENDS: list[str] = [name for name in ec_ops.BACKENDS if _works_on_cpu(name)]


def scenario_step(engine: ec.EmbeddingEngine, features: Any, weights: Any, grads: dict, style: str):
    """One step of the shared scenario by ``backward`` or by ``enqueue`` / ``dequeue`` /
    ``apply_gradients``; returns its activations by feature path."""
    if style == "backward":
        acts = engine(features, weights)
        sum((get_path(acts, p) * grads[p]).sum() for p in FEATURE_PATHS).backward()
    else:
        engine.enqueue(features, weights=weights)
        acts = engine.dequeue()
        engine.apply_gradients(nested(grads))
    return {p: get_path(acts, p).detach() for p in FEATURE_PATHS}
