"""Every optimizer hyperparameter, constant or callable, is checked against the range its update
can take (fault injection of docs/reliability.md, "Wrong results").

Constants are refused at construction, naming the optimizer, the field and the value; a
learning-rate callable is checked at each step, naming the optimizer, the table and the step,
and a refused rate leaves tables, slots, the step counter and the pending batch unchanged.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import pytest
import torch

import embcore as ec

NAN, INF = float("nan"), float("inf")
OPTIMIZERS = [ec.SGD, ec.Adagrad, ec.AdagradMomentum, ec.Adam, ec.FTRL, ec.RowwiseAdagrad]

#: bad values of the fields every optimizer shares
COMMON_FAULTS: dict[str, list[Any]] = {
    "learning_rate": [NAN, INF, -INF, -0.1, "0.1", True, None, lambda step: 0.1],
    "use_gradient_accumulation": [1, "yes", None],
    "clip_weight_min": [NAN, INF, -INF, "0"],
    "clip_weight_max": [NAN, INF, -INF, "0"],
    "weight_decay_factor": [NAN, INF, -0.1],
    "multiply_weight_decay_factor_by_learning_rate": [1, "no"],
    "clipvalue": [NAN, INF, -1.0, (NAN, 1.0), (0.0, INF), (1.0, -1.0), (1, 2, 3), "1"],
    "slot_variable_creation_fn": [3, "make"],
    "low_dimensional_packing_status": [1, None],
}

#: bad values of each optimizer's own fields: outside the range its update formula takes
OWN_FAULTS: dict[type, dict[str, list[Any]]] = {
    ec.SGD: {},
    ec.Adagrad: {"initial_accumulator_value": [0.0, -0.5, NAN, INF, "1"]},
    ec.AdagradMomentum: {
        "momentum": [NAN, INF, -INF, "0.9"],
        "use_nesterov": [1, None],
        "exponent": [0.0, -2.0, NAN, INF],
        "beta2": [-0.1, 1.5, NAN, INF],
        "epsilon": [0.0, -1e-3, NAN, INF],
    },
    ec.Adam: {
        "beta_1": [-0.1, 1.0, 1.5, NAN, INF],
        "beta_2": [-0.1, 1.0, NAN, -INF],
        "epsilon": [0.0, -1e-8, NAN, INF],
        "lazy_adam": [0, "yes"],
        "sum_inside_sqrt": [1],
        "bias_correction": [1],
    },
    ec.FTRL: {
        "learning_rate": [0.0],  # the update divides by it
        "learning_rate_power": [0.5, NAN, -INF],
        "l1_regularization_strength": [-1.0, NAN, INF],
        "l2_regularization_strength": [-0.1, INF],
        "beta": [-1.0, NAN],
        "initial_accumulator_value": [-0.1, INF],
        "multiply_linear_by_learning_rate": [1],
        "allow_zero_accumulator": [1],
    },
    ec.RowwiseAdagrad: {
        "initial_accumulator_value": [-1.0, NAN, INF],
        "epsilon": [-1.0, NAN, INF],
    },
}


def _faults() -> list[Any]:
    params = []
    for cls in OPTIMIZERS:
        for field in {**COMMON_FAULTS, **OWN_FAULTS[cls]}:
            for value in COMMON_FAULTS.get(field, []) + OWN_FAULTS[cls].get(field, []):
                params.append(
                    pytest.param(cls, field, value, id=f"{cls.__name__}-{field}-{value!r}")
                )
    return params


def test_every_hyperparameter_of_every_optimizer_is_injected() -> None:
    """A new field (or optimizer) must come with its faults here."""
    assert set(OPTIMIZERS) == {
        getattr(ec, name)
        for name in ec.optimizers.__all__
        if name not in ("LearningRate", "Optimizer", "SlotSpec")
    }
    for cls in OPTIMIZERS:
        fields = {f.name for f in dataclasses.fields(cls)}
        assert fields == set(COMMON_FAULTS) | set(OWN_FAULTS[cls]), cls.__name__


@pytest.mark.parametrize(("cls", "field", "value"), _faults())
def test_out_of_range_hyperparameters_are_refused_at_construction(
    cls: type, field: str, value: Any
) -> None:
    with pytest.raises(ValueError) as info:
        cls(**{field: value})
    message = str(info.value)
    assert message.startswith(f"{cls.__name__}: "), message
    assert field.split("[")[0] in message, message


@pytest.mark.parametrize("cls", OPTIMIZERS)
def test_the_edges_of_each_range_are_accepted(cls: type) -> None:
    edges: dict[type, dict[str, Any]] = {
        ec.SGD: {"learning_rate": 0.0, "weight_decay_factor": 0.0, "clipvalue": 0.0},
        ec.Adagrad: {"initial_accumulator_value": 1e-30},
        ec.AdagradMomentum: {"beta2": 0.0, "momentum": -0.5},
        ec.Adam: {"beta_1": 0.0, "beta_2": 0.0},
        ec.FTRL: {"learning_rate": 1e-30, "learning_rate_power": 0.0},
        ec.RowwiseAdagrad: {"initial_accumulator_value": 0.0, "epsilon": 1e-30},
    }
    cls(**edges[cls])
    if cls is ec.AdagradMomentum:
        ec.AdagradMomentum(beta2=1.0)


# ------------------------------------------------------------------ learning rates per step


class Schedule:
    """A zero-argument rate: good, then ``bad`` once, then good again."""

    def __init__(self, bad: Any) -> None:
        self.bad, self.calls = bad, 0

    def __call__(self) -> Any:
        self.calls += 1
        return self.bad if self.calls == 2 else 0.1


BAD_RATES = [NAN, INF, -INF, -0.5, "0.1", None, True, 1j, torch.tensor([0.1, 0.2])]


def _rate_cases() -> list[Any]:
    cases = [(cls, bad) for cls in OPTIMIZERS for bad in BAD_RATES]
    cases.append((ec.FTRL, 0.0))
    cases.append((ec.FTRL, torch.tensor(0.0)))
    return [pytest.param(cls, bad, id=f"{cls.__name__}-{bad!r}") for cls, bad in cases]


def _engine(optimizer: ec.Optimizer, pipelined: bool = False) -> ec.EmbeddingEngine:
    video = ec.TableConfig(vocabulary_size=10, dim=4, name="video")
    users = ec.TableConfig(vocabulary_size=6, dim=3, name="users", optimizer=ec.SGD())
    features = {"watched": ec.FeatureConfig(table=video), "user": ec.FeatureConfig(table=users)}
    return ec.EmbeddingEngine(features, optimizer=optimizer, pipeline=pipelined)


def _batch() -> dict[str, Any]:
    return {"watched": ec.RaggedIds.from_lists([[1, 2], [], [9]]), "user": torch.tensor([0, 5, 1])}


def _snapshot(engine: ec.EmbeddingEngine) -> dict[str, torch.Tensor]:
    engine.flush()
    return {k: v.clone() for k, v in engine.state_dict().items()}


def _assert_unchanged(engine: ec.EmbeddingEngine, before: dict[str, torch.Tensor]) -> None:
    after = engine.state_dict()
    assert after.keys() == before.keys()
    for key, value in before.items():
        assert torch.equal(after[key], value), key


@pytest.mark.parametrize("style", ["apply_gradients", "backward", "pipelined"])
@pytest.mark.parametrize(("cls", "bad"), _rate_cases())
def test_a_bad_rate_from_a_callable_is_refused_at_its_step(cls: type, bad: Any, style: str) -> None:
    schedule = Schedule(bad)
    engine = _engine(cls(learning_rate=schedule), pipelined=style == "pipelined")
    engine.enqueue(_batch())
    engine.apply_gradients({k: torch.ones_like(v) for k, v in engine.dequeue().items()})
    before = _snapshot(engine)
    with pytest.raises(ValueError) as info:
        if style == "backward":
            acts = engine(_batch())
            (acts["watched"].sum() + acts["user"].sum()).backward()
        else:
            engine.enqueue(_batch())
            engine.apply_gradients({k: torch.ones_like(v) for k, v in engine.dequeue().items()})
    message = str(info.value)
    assert f"{cls.__name__} of table 'video'" in message, message
    assert "learning_rate callable" in message, message
    # pipelined, the previous step's update may still be running when the rate is read
    assert ("at step " if style == "pipelined" else "at step 2") in message, message
    assert ("> 0" if cls is ec.FTRL else ">= 0") in message, message
    if isinstance(bad, float) and not math.isnan(bad):
        assert f"returned {bad}" in message, message
    assert schedule.calls == 2
    _assert_unchanged(engine, before)
    if style != "backward":
        # the batch is still pending: the same gradients go through once the rate is good
        assert engine._pending is not None
        grads = {"watched": torch.ones(3, 4), "user": torch.ones(3, 3)}
        engine.apply_gradients(grads)
    else:
        engine(_batch())["watched"].sum().backward()
    engine.flush()
    assert engine.step == 2
    assert schedule.calls == 3


def test_a_callable_shared_by_two_tables_is_checked_for_each() -> None:
    """0 is a valid rate for SGD but not for FTRL: the FTRL table is named."""
    zero = Schedule(0.0)
    video = ec.TableConfig(vocabulary_size=10, dim=4, name="video", optimizer=ec.SGD(zero))
    users = ec.TableConfig(vocabulary_size=6, dim=3, name="users")
    features = {"watched": ec.FeatureConfig(table=video), "user": ec.FeatureConfig(table=users)}
    engine = ec.EmbeddingEngine(features, optimizer=ec.FTRL(learning_rate=zero))
    engine(_batch())["watched"].sum().backward()
    before = _snapshot(engine)
    with pytest.raises(ValueError, match=r"FTRL of table 'users': .* returned 0.0 at step 2"):
        engine(_batch())["watched"].sum().backward()
    _assert_unchanged(engine, before)
    assert zero.calls == 2  # called once for both tables


@pytest.mark.parametrize(
    "rate", [0.25, 1, torch.tensor(0.25), torch.tensor([0.25]), torch.tensor(1, dtype=torch.int32)]
)
def test_real_rates_of_any_numeric_type_are_used(rate: Any) -> None:
    opt = ec.SGD(learning_rate=lambda: rate)
    assert opt.learning_rate_at(1, table="t") == float(rate)
    assert isinstance(opt.learning_rate_at(1), float)


def test_a_callable_that_needs_arguments_is_refused_at_construction() -> None:
    with pytest.raises(ValueError, match=r"Adam: learning_rate must be .* taking no arguments"):
        ec.Adam(learning_rate=lambda step: 0.1)
    ec.Adam(learning_rate=lambda step=0: 0.1)  # defaults are fine
