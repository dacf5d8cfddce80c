"""The two ways to train give the same bits, and a state_dict carries a run exactly.

For every optimizer of the conformance list, on every backend: N steps of
``enqueue``/``dequeue``/``apply_gradients`` and N steps of ``acts = emb(batch);
loss.backward()`` on an identically built engine leave bit-identical tables and slots. The
shared scenario has two shared tables, a sequence feature and a nested structure (a dict holding
a tuple and a list).
"""

from __future__ import annotations

import io
from collections.abc import Iterator

import numpy as np
import pytest
import torch
from engine_cases import (
    BACKENDS,
    FEATURE_PATHS,
    OPTIMIZER_CASES,
    OptCase,
    get_path,
    nested,
    random_gradients,
    scenario_batch,
    scenario_features,
    scenario_tables,
)

import embcore as ec

STEPS = (4, 3, 5)  # batch sizes of the steps

# Every optimizer, and every option that changes what the engine stores or how it steps:
# slots of another shape (row-wise), non-lazy updates, the step count (bias correction),
# decay and clipping, zero accumulators. (The NumPy checks of test_optimizers run them all.)
API_CASES = [
    c
    for c in OPTIMIZER_CASES
    if c.id
    in {
        "sgd-cliplist-decay-by-lr-wclip",
        "adagrad-init-clipmax-wclip",
        "adagrad_momentum-nesterov-beta2-exp3",
        "adam-non-lazy-decay-wclip",
        "adam-bias-correction",
        "adam-eps-outside-sqrt",
        "ftrl-l1-l2-beta-power",
        "ftrl-multiply-linear-zero-accumulator",
        "rowwise_adagrad-zero-init-eps-clip-decay",
    }
]
API_IDS = [c.id for c in API_CASES]


@pytest.fixture(autouse=True)
def _one_thread() -> Iterator[None]:
    """Tiny tensors: thread hand-offs cost more than the work on a busy 2-core machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def assert_same_state(left: ec.EmbeddingEngine, right: ec.EmbeddingEngine) -> None:
    assert left.step == right.step
    assert left.table_names == right.table_names
    for name, table in left.embedding_tables.items():
        assert torch.equal(table, right.embedding_tables[name]), f"table {name}"
    assert left.slot_variables.keys() == right.slot_variables.keys()
    for name, slots in left.slot_variables.items():
        other = right.slot_variables[name]
        assert slots.keys() == other.keys()
        for slot, value in slots.items():
            assert torch.equal(value, other[slot]), f"{name}/{slot}"


def engines(case: OptCase, backend: str, count: int = 2, seed: int = 4):
    rng = np.random.default_rng(seed)
    ta, tb, _ = scenario_tables(rng)
    built = [
        ec.EmbeddingEngine(scenario_features(ta, tb), case.make(), backend=backend)
        for _ in range(count)
    ]
    return built, rng


def seeds_step(engine: ec.EmbeddingEngine, batch, grads, use_autograd: bool):
    """One step with enqueue, dequeue and apply_gradients; returns the activations."""
    engine.enqueue(batch.features, weights=batch.weights)
    acts = engine.dequeue()
    if use_autograd:  # the dequeued activations are leaves: autograd gives the gradients
        flat = [get_path(acts, p) for p in FEATURE_PATHS]
        loss = sum((a * grads[p]).sum() for a, p in zip(flat, FEATURE_PATHS, strict=True))
        found = torch.autograd.grad(loss, flat)
        engine.apply_gradients(nested(dict(zip(FEATURE_PATHS, found, strict=True))))
    else:
        engine.apply_gradients(nested(grads))
    return acts


def torch_step(engine: ec.EmbeddingEngine, batch, grads):
    """One step in the PyTorch style; the feature dict's keys come in another order."""
    features = {"user": batch.features["user"], "item": batch.features["item"]}
    acts = engine(features, batch.weights)
    assert list(acts) == ["item", "user"]  # the feature config's structure
    assert isinstance(acts["item"], tuple) and isinstance(acts["user"], list)
    loss = sum((get_path(acts, p) * grads[p]).sum() for p in FEATURE_PATHS)
    loss.backward()
    return acts


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", API_CASES, ids=API_IDS)
def test_enqueue_apply_equals_backward(case: OptCase, backend: str) -> None:
    (seeds, torchy), rng = engines(case, backend)
    assert_same_state(seeds, torchy)
    for step, batch_size in enumerate(STEPS):
        batch = scenario_batch(rng, batch_size)
        grads = random_gradients(rng, batch)
        acts_seeds = seeds_step(seeds, batch, grads, use_autograd=step == 1)
        acts_torch = torch_step(torchy, batch, grads)
        for path in FEATURE_PATHS:
            assert torch.equal(get_path(acts_seeds, path), get_path(acts_torch, path)), path
        assert get_path(acts_torch, ("user", 1)).shape == (batch_size, 3, 13)
        assert_same_state(seeds, torchy)
    assert seeds.step == len(STEPS)
    # training did something, so the comparison above was not vacuous
    fresh, _ = engines(case, backend, count=1)
    assert not torch.equal(fresh[0].embedding_tables["a"], seeds.embedding_tables["a"])


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", API_CASES, ids=API_IDS)
def test_state_dict_round_trip(case: OptCase, backend: str) -> None:
    """A fresh engine (other seed, other initial values) loads tables, slots and the step
    count, and then takes the same next step bit for bit."""
    (trained,), rng = engines(case, backend, count=1)
    for batch_size in STEPS[:2]:
        batch = scenario_batch(rng, batch_size)
        seeds_step(trained, batch, random_gradients(rng, batch), use_autograd=False)

    buffer = io.BytesIO()
    torch.save(trained.state_dict(), buffer)
    buffer.seek(0)
    state = torch.load(buffer, weights_only=True)
    slot_keys = {f"{t}.{s}" for t, slots in trained.slot_variables.items() for s in slots}
    assert set(state) == {"step", "a.weight", "b.weight"} | slot_keys

    ta, tb, _ = scenario_tables(np.random.default_rng(99))  # different initial values
    fresh = ec.EmbeddingEngine(scenario_features(ta, tb), case.make(), seed=7, backend=backend)
    assert not torch.equal(fresh.embedding_tables["a"], trained.embedding_tables["a"])
    fresh.load_state_dict(state)
    assert_same_state(trained, fresh)

    batch = scenario_batch(rng, STEPS[2])
    grads = random_gradients(rng, batch)
    seeds_step(trained, batch, grads, use_autograd=False)
    torch_step(fresh, batch, grads)
    assert_same_state(trained, fresh)


ZERO_MOVES = [c for c in OPTIMIZER_CASES if c.id in {"adam", "adagrad_momentum", "ftrl"}]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", ZERO_MOVES, ids=[c.id for c in ZERO_MOVES])
def test_activation_left_out_of_the_loss_is_a_zero_gradient(case: OptCase, backend: str) -> None:
    """docs/semantics.md §3.15 in the PyTorch style: an activation the loss does not use reaches
    backward as None and is applied as zeros, exactly like a None in apply_gradients (which warns).
    Pinned: the PyTorch style does not warn, since autograd gives None for unused outputs
    routinely."""
    (seeds, torchy), rng = engines(case, backend)
    for batch_size in STEPS:
        batch = scenario_batch(rng, batch_size)
        grads = random_gradients(rng, batch)
        partial = {**grads, ("item", 0): None}
        seeds.enqueue(batch.features, weights=batch.weights)
        seeds.dequeue()
        with pytest.warns(UserWarning, match="no gradient"):
            seeds.apply_gradients(nested(partial))
        acts = torchy(batch.features, batch.weights)
        loss = sum((get_path(acts, p) * grads[p]).sum() for p in FEATURE_PATHS[1:])
        loss.backward()
        assert_same_state(seeds, torchy)
