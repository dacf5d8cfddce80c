"""Engine training against an independent NumPy float64 model of docs/semantics.md §3.

Each optimizer of the conformance list (``engine_cases.OPTIMIZER_CASES``) trains the shared
scenario (two tables, four features sharing them, a sequence feature, duplicates, empty samples,
a changing batch size) for a few steps, on every backend; tables and slots must match the NumPy
model after every step, and rows no id touched must stay bit-identical (except for non-lazy
Adam, whose untouched rows the model also moves).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

import numpy as np
import numpy_reference as ref
import pytest
import torch
from engine_cases import (
    BACKENDS,
    DIM_A,
    DIM_B,
    FEATURE_PATHS,
    FEATURE_TABLE,
    OPTIMIZER_CASES,
    OPTIMIZER_IDS,
    VOCAB_A,
    VOCAB_B,
    OptCase,
    StepBatch,
    dense_samples,
    get_path,
    initializer_from,
    nested,
    ragged_input,
    ragged_samples,
    random_gradients,
    scenario_batch,
    scenario_features,
    scenario_tables,
)
from numpy.testing import assert_allclose

import embcore as ec

RTOL, ATOL = 1e-5, 1e-6
SHAPES = {"a": (VOCAB_A, DIM_A), "b": (VOCAB_B, DIM_B)}
COMBINERS = {"a": "sqrtn", "b": "mean"}
Grads = dict[tuple[str, int], Any]


@pytest.fixture(autouse=True)
def _one_thread() -> Iterator[None]:
    """Tiny tensors: thread hand-offs cost more than the work on a busy 2-core machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


class RefEngine:
    """The NumPy model of the scenario's two tables."""

    def __init__(self, opts: dict[str, tuple[str, dict[str, Any]]], values: dict[str, Any]):
        self.opts = opts
        self.tables = {name: values[name].astype(np.float64) for name in SHAPES}
        self.slots = {
            name: ref.initial_slots(opts[name][0], opts[name][1], *SHAPES[name]) for name in SHAPES
        }
        self.touched_ever = {name: np.zeros(SHAPES[name][0], dtype=bool) for name in SHAPES}
        self.t = 0

    def lookup(self, batch: StepBatch) -> dict[tuple[str, int], np.ndarray]:
        out = {}
        for path in FEATURE_PATHS:
            name = FEATURE_TABLE[path]
            combiner = batch.combiner(path, COMBINERS)
            act = ref.lookup(self.tables[name], batch.samples[path], combiner)
            out[path] = act.reshape(*batch.shapes[path], SHAPES[name][1])
        return out

    def step(self, batch: StepBatch, grads: Grads, lrs: dict[str, float]) -> None:
        self.t += 1
        for name, (vocab, dim) in SHAPES.items():
            feats = []
            for p in FEATURE_PATHS:
                if FEATURE_TABLE[p] != name:
                    continue
                g = grads[p]
                g = np.zeros((len(batch.samples[p]), dim)) if g is None else g.numpy()
                feats.append((batch.samples[p], batch.combiner(p, COMBINERS), g))
            g, touched = ref.row_gradients(vocab, dim, feats)
            self.touched_ever[name] |= touched
            kind, hp = self.opts[name]
            table, slots = self.tables[name], self.slots[name]
            ref.apply_update(kind, hp, table, slots, g, touched, lrs[name], self.t)


def assert_matches(engine: ec.EmbeddingEngine, model: RefEngine, initial: dict[str, Any]) -> None:
    """Tables and slots match the model; never-touched rows are bit-identical (lazy only)."""
    tables, slots = engine.embedding_tables, engine.slot_variables
    for name in SHAPES:
        got = tables[name].numpy()
        assert_allclose(got, model.tables[name], rtol=RTOL, atol=ATOL, err_msg=f"table {name}")
        assert sorted(slots[name]) == sorted(model.slots[name])
        for slot, value in model.slots[name].items():
            assert slots[name][slot].dtype == torch.float32
            assert_allclose(
                slots[name][slot].numpy(), value, rtol=RTOL, atol=ATOL, err_msg=f"{name}/{slot}"
            )
        kind, hp = model.opts[name]
        if ref.is_lazy(kind, hp):
            never = torch.from_numpy(~model.touched_ever[name])
            assert bool(never.any())
            assert torch.equal(tables[name][never], torch.from_numpy(initial[name])[never])
            for slot, value in ref.initial_slots(kind, hp, *SHAPES[name]).items():
                start = torch.from_numpy(value).float()
                assert torch.equal(slots[name][slot][never], start[never]), f"{name}/{slot}"


def build(case: OptCase, backend: str, seed: int = 1):
    rng = np.random.default_rng(seed)
    ta, tb, values = scenario_tables(rng, *COMBINERS.values())
    engine = ec.EmbeddingEngine(scenario_features(ta, tb), optimizer=case.make(), backend=backend)
    model = RefEngine({"a": (case.kind, case.hp), "b": (case.kind, case.hp)}, values)
    return engine, model, values, rng


def train_step(engine, model, batch: StepBatch, grads: Grads, lrs: dict[str, float]) -> None:
    engine.enqueue(batch.features, weights=batch.weights)
    acts = engine.dequeue()
    expected = model.lookup(batch)
    for path in FEATURE_PATHS:
        act = get_path(acts, path)
        assert tuple(act.shape) == expected[path].shape
        assert_allclose(act.detach().numpy(), expected[path], rtol=RTOL, atol=ATOL)
    engine.apply_gradients(nested(grads))
    model.step(batch, grads, lrs)


# ----------------------------------------------------------------------------- the main check


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", OPTIMIZER_CASES, ids=OPTIMIZER_IDS)
def test_training_matches_numpy_reference(case: OptCase, backend: str) -> None:
    engine, model, values, rng = build(case, backend)
    lr = case.hp["learning_rate"]
    lazy = ref.is_lazy(case.kind, case.hp)
    # the batch size changes between steps; step 2 only reads low ids, leaving rows alone
    for step, (batch_size, ids_a, ids_b) in enumerate([(4, 8, 7), (3, 4, 3), (5, 8, 7)]):
        batch = scenario_batch(rng, batch_size, ids_a=ids_a, ids_b=ids_b)
        seen = {n: model.touched_ever[n].copy() for n in SHAPES}
        before = {n: t.clone() for n, t in engine.embedding_tables.items()}
        train_step(engine, model, batch, random_gradients(rng, batch), {"a": lr, "b": lr})
        assert_matches(engine, model, values)
        if not lazy and step == 1:
            # non-lazy Adam: rows seen before but not in this step still moved (g = 0)
            for name in SHAPES:
                left_alone = torch.from_numpy(seen[name] & ~touched_rows(batch, name))
                moved = (engine.embedding_tables[name] != before[name]).any(dim=1)
                assert bool(left_alone.any()) and bool(moved[left_alone].all())
    assert engine.step == 3


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", OPTIMIZER_CASES, ids=OPTIMIZER_IDS)
def test_none_gradients_are_zeros_and_warn(case: OptCase, backend: str) -> None:
    """docs/semantics.md §3.15: a None gradient sends zeros (with a warning), which still touch the
    looked-up rows: Adam and AdagradMomentum rows keep moving, FTRL rows are recomputed."""
    engine, model, values, rng = build(case, backend, seed=2)
    lr = {"a": case.hp["learning_rate"], "b": case.hp["learning_rate"]}
    # steps 1 and 2 use ids < 5 on A and < 4 on B, step 3 all ids: some rows are first
    # touched by the all-zero gradient of step 3
    first = scenario_batch(rng, 4, ids_a=5, ids_b=4)
    train_step(engine, model, first, random_gradients(rng, first), lr)

    second = scenario_batch(rng, 5, ids_a=5, ids_b=4)
    grads: Grads = dict(random_gradients(rng, second))
    grads[("item", 0)] = None  # one feature without a gradient
    engine.enqueue(second.features, weights=second.weights)
    engine.dequeue()
    with pytest.warns(UserWarning, match="no gradient"):
        engine.apply_gradients(nested(grads))
    model.step(second, grads, lr)
    assert_matches(engine, model, values)
    seen = {n: torch.from_numpy(model.touched_ever[n].copy()) for n in SHAPES}
    before = {n: t.clone() for n, t in engine.embedding_tables.items()}

    third = scenario_batch(rng, 6)
    engine.enqueue(third.features, weights=third.weights)
    engine.dequeue()
    none: Grads = dict.fromkeys(FEATURE_PATHS)
    with pytest.warns(UserWarning, match="no gradient"):
        engine.apply_gradients(nested(none))
    model.step(third, none, lr)
    assert_matches(engine, model, values)

    after = engine.embedding_tables
    plain = not any(
        case.hp.get(k) for k in ("weight_decay_factor", "clip_weight_min", "clip_weight_max")
    )
    for name in SHAPES:
        now = torch.from_numpy(touched_rows(third, name))
        old, new = seen[name] & now, ~seen[name] & now
        assert bool(old.any()) and bool(new.any())
        if case.kind in ("sgd", "adagrad", "rowwise_adagrad") and plain:
            assert torch.equal(after[name], before[name])  # g = 0 changes nothing
        if case.kind in ("adam", "adagrad_momentum"):
            moved = (after[name][old] != before[name][old]).any(dim=1)
            assert bool(moved.all()), "rows with momentum must move on a zero gradient"
        if case.kind == "ftrl":
            # first touch with g = 0: linear stays 0, so the weight is recomputed as 0
            assert torch.equal(after[name][new], torch.zeros_like(after[name][new]))
            assert bool((before[name][new] != 0).all())


def touched_rows(batch: StepBatch, name: str) -> np.ndarray:
    out = np.zeros(SHAPES[name][0], dtype=bool)
    for path in FEATURE_PATHS:
        if FEATURE_TABLE[path] == name:
            for sample in batch.samples[path]:
                for i, _ in sample:
                    out[i] = True
    return out


# ----------------------------------------------------------------- dynamic learning rates


class CountingSchedule:
    """A zero-argument learning rate that counts its calls."""

    def __init__(self, values: list[float]) -> None:
        self.values = values
        self.calls = 0

    def __call__(self) -> float:
        value = self.values[self.calls]
        self.calls += 1
        return value


# one case per optimizer, plus the options whose formula reads the rate differently
CALLABLE_LR_CASES = [
    c
    for c in OPTIMIZER_CASES
    if c.id
    in {
        "sgd-cliplist-decay-by-lr-wclip",
        "adagrad",
        "adagrad_momentum-nesterov-beta2-exp3",
        "adam-bias-correction",
        "adam-non-lazy",
        "ftrl-l1-l2-beta-power",
        "ftrl-multiply-linear",
        "rowwise_adagrad",
    }
]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", CALLABLE_LR_CASES, ids=[c.id for c in CALLABLE_LR_CASES])
def test_callable_learning_rate_once_per_step_shared_by_two_tables(
    case: OptCase, backend: str
) -> None:
    """docs/semantics.md §3.13 / §7: one call per step and per distinct callable, its value used by
    every table holding it; both FTRL forms follow the rate's changes as the NumPy model does."""
    schedule = CountingSchedule([0.1, 0.03, 0.2, 0.07, 0.15])
    rng = np.random.default_rng(3)
    ta, tb, values = scenario_tables(rng, *COMBINERS.values())
    # table a has its own optimizer object, table b takes the engine's: one shared callable
    ta = dataclasses.replace(ta, optimizer=case.make(learning_rate=schedule))
    engine = ec.EmbeddingEngine(
        scenario_features(ta, tb), optimizer=case.make(learning_rate=schedule), backend=backend
    )
    assert schedule.calls == 0
    model = RefEngine({"a": (case.kind, case.hp), "b": (case.kind, case.hp)}, values)
    for step in range(3):
        batch = scenario_batch(rng, 4)
        lr = schedule.values[step]
        train_step(engine, model, batch, random_gradients(rng, batch), {"a": lr, "b": lr})
        assert schedule.calls == step + 1
        assert_matches(engine, model, values)
    # an inference lookup reads no rate
    engine.enqueue(scenario_batch(rng, 3).features, training=False)
    engine.dequeue()
    assert schedule.calls == 3
    # the PyTorch style also reads it once per step
    batch = scenario_batch(rng, 4)
    grads = random_gradients(rng, batch)
    acts = engine(batch.features, batch.weights)
    loss = sum((get_path(acts, p) * grads[p]).sum() for p in FEATURE_PATHS)
    loss.backward()
    assert schedule.calls == 4
    model.step(batch, grads, {"a": schedule.values[3], "b": schedule.values[3]})
    assert_matches(engine, model, values)


# ------------------------------------------------------------ one optimizer per table


MIXED = [
    ("adam-non-lazy", "adam"),  # a non-lazy and a lazy table in one step
    ("ftrl-multiply-linear", "rowwise_adagrad"),
    ("adagrad_momentum-nesterov-beta2-exp3", "sgd-clip-decay"),
]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(("id_a", "id_b"), MIXED, ids=[f"{a}+{b}" for a, b in MIXED])
def test_tables_with_different_optimizers(id_a: str, id_b: str, backend: str) -> None:
    """docs/semantics.md §1.13: a TableConfig's own optimizer wins over the engine's; each table
    follows its own rule in the same step."""
    case_a, case_b = (next(c for c in OPTIMIZER_CASES if c.id == i) for i in (id_a, id_b))
    rng = np.random.default_rng(5)
    ta, tb, values = scenario_tables(rng, *COMBINERS.values())
    ta = dataclasses.replace(ta, optimizer=case_a.make())
    engine = ec.EmbeddingEngine(scenario_features(ta, tb), optimizer=case_b.make(), backend=backend)
    model = RefEngine({"a": (case_a.kind, case_a.hp), "b": (case_b.kind, case_b.hp)}, values)
    lrs = {"a": case_a.hp["learning_rate"], "b": case_b.hp["learning_rate"]}
    for batch_size, ids_a in ((4, 8), (3, 4), (5, 8)):
        batch = scenario_batch(rng, batch_size, ids_a=ids_a)
        train_step(engine, model, batch, random_gradients(rng, batch), lrs)
        assert_matches(engine, model, values)


# ------------------------------------------------------------- summing before one update


def _one_table_engine(optimizer: ec.Optimizer, init: np.ndarray, backend: str, combiner="sum"):
    table = ec.TableConfig(
        init.shape[0],
        init.shape[1],
        initializer=initializer_from(init),
        combiner=combiner,
        name="t",
    )
    return ec.EmbeddingEngine(
        {"x": ec.FeatureConfig(table), "y": ec.FeatureConfig(table)},
        optimizer=optimizer,
        backend=backend,
    )


@pytest.mark.parametrize("backend", BACKENDS)
def test_duplicates_within_and_across_features_are_summed_before_one_update(
    backend: str,
) -> None:
    """docs/semantics.md §3.1 / §2.6: Adagrad's accumulator grows by (sum g)^2, not by sum(g^2)."""
    init = np.full((4, 3), 0.5, dtype=np.float32)
    engine = _one_table_engine(ec.Adagrad(learning_rate=0.1), init, backend)
    rows = [[(1, 1.0), (1, 1.0), (2, 1.0)]]  # row 1 twice in x's only sample
    ids, _ = ragged_input(rows, weighted=False)
    gx = np.array([[0.5, -1.0, 2.0]], dtype=np.float32)
    gy = np.array([[0.25, 0.5, -0.75]], dtype=np.float32)
    engine.enqueue({"x": ids, "y": torch.tensor([1])})
    engine.dequeue()
    engine.apply_gradients({"x": torch.from_numpy(gx), "y": torch.from_numpy(gy)})

    g1 = 2 * gx[0].astype(np.float64) + gy[0]  # two occurrences in x (sum combiner), one in y
    acc = engine.slot_variables["t"]["accumulators"]
    assert_allclose(acc[1].numpy(), 0.1 + g1**2, rtol=RTOL)
    assert not np.allclose(acc[1].numpy(), 0.1 + 2 * gx[0] ** 2 + gy[0] ** 2, rtol=1e-3)
    assert_allclose(acc[2].numpy(), 0.1 + gx[0].astype(np.float64) ** 2, rtol=RTOL)
    w = engine.embedding_tables["t"]
    assert_allclose(w[1].numpy(), 0.5 - 0.1 * g1 / np.sqrt(0.1 + g1**2), rtol=RTOL)
    for r in (0, 3):
        assert torch.equal(w[r], torch.from_numpy(init[r]))
        assert torch.equal(acc[r], torch.full((3,), 0.1))

    # the same sums with the reference's machinery, through mean and sqrtn combiners and weights
    for combiner in ("mean", "sqrtn"):
        engine = _one_table_engine(ec.Adagrad(learning_rate=0.1), init, backend, combiner)
        weighted = [[(1, 2.0), (1, 0.5), (2, 1.5)], [(3, 1.0)]]
        ids, weights = ragged_input(weighted)
        engine.enqueue({"x": ids, "y": torch.tensor([1, 1])}, weights={"x": weights, "y": None})
        engine.dequeue()
        gx2 = np.arange(6, dtype=np.float32).reshape(2, 3) / 4
        gy2 = -np.arange(6, dtype=np.float32).reshape(2, 3) / 8
        engine.apply_gradients({"x": torch.from_numpy(gx2), "y": torch.from_numpy(gy2)})
        grad, touched = ref.row_gradients(
            4,
            3,
            [
                (ragged_samples(weighted), combiner, gx2),
                (dense_samples(np.array([1, 1])), combiner, gy2),
            ],
        )
        acc_ref = np.full((4, 3), 0.1)
        acc_ref[touched] += grad[touched] ** 2
        acc = engine.slot_variables["t"]["accumulators"]
        assert_allclose(acc.numpy(), acc_ref, rtol=RTOL, atol=ATOL)


# ------------------------------------------------------------------ common option details


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    ("multiply", "expected"),
    [
        # decay first, then the update: (1 - 0.5) * 1 - 0.1 * 1
        (False, 0.4),
        # factor times lr: (1 - 0.5 * 0.1) * 1 - 0.1 * 1
        (True, 0.85),
    ],
)
def test_weight_decay_happens_before_the_update(
    multiply: bool, expected: float, backend: str
) -> None:
    """docs/semantics.md §3.12: w <- w - wd_eff * w on touched rows, then the optimizer's rule."""
    init = np.ones((3, 2), dtype=np.float32)
    opt = ec.SGD(
        learning_rate=0.1,
        weight_decay_factor=0.5,
        multiply_weight_decay_factor_by_learning_rate=multiply,
    )
    engine = _one_table_engine(opt, init, backend)
    engine.enqueue({"x": torch.tensor([0]), "y": torch.tensor([2])})
    engine.dequeue()
    with pytest.warns(UserWarning, match="no gradient"):
        engine.apply_gradients({"x": torch.ones(1, 2), "y": None})
    w = engine.embedding_tables["t"]
    assert_allclose(w[0].numpy(), [expected, expected], rtol=1e-6)
    # row 2 had a zero gradient: decay only
    decayed = 1 - 0.5 * (0.1 if multiply else 1.0)
    assert_allclose(w[2].numpy(), [decayed, decayed], rtol=1e-6)
    assert torch.equal(w[1], torch.ones(2))  # untouched: not decayed


@pytest.mark.parametrize("backend", BACKENDS)
def test_weight_clipping_only_touches_updated_rows(backend: str) -> None:
    """docs/semantics.md §3.11 / §6 pitfall 29: a zero-gradient touch clips an out-of-range row;
    others stay."""
    init = np.array([[2.0, -2.0], [2.0, -2.0], [0.1, 0.2]], dtype=np.float32)
    opt = ec.SGD(learning_rate=0.1, clip_weight_min=-1.0, clip_weight_max=1.5)
    engine = _one_table_engine(opt, init, backend)
    engine.enqueue({"x": torch.tensor([0]), "y": torch.tensor([2])})
    engine.dequeue()
    engine.apply_gradients({"x": torch.zeros(1, 2), "y": torch.zeros(1, 2)})
    w = engine.embedding_tables["t"]
    assert_allclose(w[0].numpy(), [1.5, -1.0])
    assert torch.equal(w[1], torch.from_numpy(init[1]))
    assert torch.equal(w[2], torch.from_numpy(init[2]))


@pytest.mark.parametrize(
    ("clipvalue", "expected"),
    [
        (0.5, [-0.5, 0.2, 0.5]),
        ((None, 0.1), [-3.0, 0.1, 0.1]),
        ((-0.2, None), [-0.2, 0.2, 3.0]),
        ([-0.2, 0.1], [-0.2, 0.1, 0.1]),
    ],
    ids=["scalar", "tuple-no-min", "tuple-no-max", "list"],
)
@pytest.mark.parametrize("backend", BACKENDS)
def test_clipvalue_clamps_the_summed_gradient(clipvalue, expected, backend: str) -> None:
    """docs/semantics.md §3.10 / §6 pitfall 15: element-wise clamp of the summed row gradient;
    either side may be None; a list works like a tuple."""
    init = np.zeros((2, 3), dtype=np.float32)
    engine = _one_table_engine(ec.SGD(learning_rate=1.0, clipvalue=clipvalue), init, backend)
    engine.enqueue({"x": torch.tensor([1]), "y": torch.tensor([1])})
    engine.dequeue()
    # summed: [-3, 0.2, 3]; each half alone would clip differently
    engine.apply_gradients(
        {"x": torch.tensor([[-1.5, 0.1, 1.5]]), "y": torch.tensor([[-1.5, 0.1, 1.5]])}
    )
    assert_allclose(engine.embedding_tables["t"][1].numpy(), -np.array(expected), rtol=1e-6)


# --------------------------------------------------------------------- constructor checks


@pytest.mark.parametrize(
    ("make", "words"),
    [
        # docs/semantics.md §1.3
        (lambda: ec.Adagrad(initial_accumulator_value=0.0), ["initial_accumulator_value", "0"]),
        (lambda: ec.Adagrad(initial_accumulator_value=-0.5), ["initial_accumulator_value", "-0.5"]),
        # docs/semantics.md §1.4
        (lambda: ec.AdagradMomentum(epsilon=0.0), ["epsilon", "0"]),
        (lambda: ec.AdagradMomentum(epsilon=-1e-3), ["epsilon", "-0.001"]),
        (lambda: ec.AdagradMomentum(exponent=0), ["exponent", "0"]),
        (lambda: ec.AdagradMomentum(exponent=-2.0), ["exponent", "-2"]),
        # docs/semantics.md §1.5 and §6 pitfall 16: the messages name the right field
        (lambda: ec.Adam(beta_1=1.0), ["beta_1", "1.0"]),
        (lambda: ec.Adam(beta_1=-0.1), ["beta_1", "-0.1"]),
        (lambda: ec.Adam(beta_2=1.0), ["beta_2", "1.0"]),
        (lambda: ec.Adam(beta_2=1.5), ["beta_2", "1.5"]),
        (lambda: ec.Adam(epsilon=0.0), ["epsilon", "0"]),
        # docs/semantics.md §1.6 and §6 pitfall 17
        (lambda: ec.FTRL(initial_accumulator_value=-0.1), ["initial_accumulator_value", "-0.1"]),
        (lambda: ec.FTRL(learning_rate_power=0.5), ["learning_rate_power", "0.5"]),
        (lambda: ec.FTRL(l1_regularization_strength=-1.0), ["l1_regularization_strength", "-1"]),
        (lambda: ec.FTRL(l2_regularization_strength=-0.1), ["l2_regularization_strength", "-0.1"]),
        # pitfall 15 and 29: ranges must be ordered
        (lambda: ec.SGD(clipvalue=(1.0, -1.0)), ["clipvalue", "1.0", "-1.0"]),
        (lambda: ec.Adagrad(clipvalue=[0.5, 0.1]), ["clipvalue", "0.5", "0.1"]),
        (lambda: ec.SGD(clipvalue=-1.0), ["clipvalue", "-1"]),
        (lambda: ec.SGD(clipvalue=(1.0, 2.0, 3.0)), ["clipvalue"]),
        (lambda: ec.Adam(clip_weight_min=1.0, clip_weight_max=-1.0), ["clip_weight_min", "1.0"]),
        (
            lambda: ec.RowwiseAdagrad(initial_accumulator_value=0.0, epsilon=0.0),
            ["initial_accumulator_value", "epsilon"],
        ),
    ],
)
def test_constructor_validation(make, words: list[str]) -> None:
    with pytest.raises(ValueError) as info:
        make()
    message = str(info.value)
    for word in words:
        assert word in message, (word, message)


def test_adam_beta_2_message_does_not_blame_beta_1() -> None:
    """Pitfall 16: TF prints beta_1 for a bad beta_2."""
    with pytest.raises(ValueError, match="beta_2") as info:
        ec.Adam(beta_2=1.0)
    assert "beta_1" not in str(info.value)


def test_non_lazy_adam_without_accumulation_says_to_turn_it_on() -> None:
    """docs/semantics.md §1.5 / §6 pitfall 16: TF's message says to set the flag to False, which is
    backwards."""
    with (
        pytest.raises(ValueError, match=r"use_gradient_accumulation=True") as info,
        pytest.warns(UserWarning, match="use_gradient_accumulation"),
    ):
        ec.Adam(lazy_adam=False, use_gradient_accumulation=False)
    assert "lazy_adam" in str(info.value)
    assert "use_gradient_accumulation=False" not in str(info.value).replace("lazy_adam=False", "")


def test_accepted_values_at_the_edges() -> None:
    """FTRL allows a zero accumulator (pitfall 17) and power 0; a clipvalue list equals the
    tuple; AdagradMomentum does not range-check momentum (docs/semantics.md §1.4) and takes beta2 in
    [0, 1]."""
    ec.FTRL(initial_accumulator_value=0.0, learning_rate_power=0.0)
    assert ec.SGD(clipvalue=[-0.5, 1.0]).clipvalue == ec.SGD(clipvalue=(-0.5, 1.0)).clipvalue
    assert ec.SGD(clipvalue=2.0).clipvalue == (-2.0, 2.0)
    ec.AdagradMomentum(momentum=1.5, beta2=0.5)
    ec.Adam(beta_1=0.0, beta_2=0.0)
    ec.SGD(clip_weight_min=0.5, clip_weight_max=0.5)
