"""Every field of every v1 ``*Parameters`` class reaches the engine's optimizer.

The classes and their fields are discovered from the module, so a new class or field without
an entry in ``FIELDS`` below fails :func:`test_every_field_has_a_mapping`. For each field, a
parameter object with that one field set to a value other than its default is given to an
``EmbeddingConfigSpec`` (as the spec's parameters, and as a v1 table's own), the engine is
built as the Estimator builds it, and the table's optimizer is compared field by field with
the embcore optimizer written out here from the v1-to-embcore table of
``embcore.feature_column.parameters``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
from typing import Any

import pytest

import embcore as ec
import embcore.feature_column as fc
from embcore.feature_column import parameters
from embcore.feature_column.lookup import EmbeddingLookup

#: every public parameter class of the module, found by inspection
CLASSES = sorted(
    (
        cls
        for cls in vars(parameters).values()
        if inspect.isclass(cls)
        and issubclass(cls, parameters.OptimizationParameters)
        and cls is not parameters.OptimizationParameters
    ),
    key=lambda cls: cls.__name__,
)

#: the embcore optimizer each class builds
TARGET: dict[str, type[ec.Optimizer]] = {
    "AdagradParameters": ec.Adagrad,
    "AdamParameters": ec.Adam,
    "FtrlParameters": ec.FTRL,
    "StochasticGradientDescentParameters": ec.SGD,
}

#: v1 field -> (the embcore field it sets, a value other than the v1 default). The two
#: gradient clip limits share one embcore field, ``clipvalue=(min, max)``.
COMMON: dict[str, tuple[str, Any]] = {
    "learning_rate": ("learning_rate", 0.125),
    "use_gradient_accumulation": ("use_gradient_accumulation", False),
    "clip_weight_min": ("clip_weight_min", -0.5),
    "clip_weight_max": ("clip_weight_max", 0.75),
    "weight_decay_factor": ("weight_decay_factor", 0.01),
    "multiply_weight_decay_factor_by_learning_rate": (
        "multiply_weight_decay_factor_by_learning_rate",
        True,
    ),
    "clip_gradient_min": ("clipvalue", -0.25),
    "clip_gradient_max": ("clipvalue", 0.5),
}
FIELDS: dict[str, dict[str, tuple[str, Any]]] = {
    "AdagradParameters": {**COMMON, "initial_accumulator": ("initial_accumulator_value", 0.5)},
    "AdamParameters": {
        **COMMON,
        "beta1": ("beta_1", 0.5),
        "beta2": ("beta_2", 0.9),
        "epsilon": ("epsilon", 1e-3),
        "lazy_adam": ("lazy_adam", False),
        "sum_inside_sqrt": ("sum_inside_sqrt", False),
    },
    "FtrlParameters": {
        **COMMON,
        "learning_rate_power": ("learning_rate_power", -0.25),
        "initial_accumulator_value": ("initial_accumulator_value", 0.0),
        "l1_regularization_strength": ("l1_regularization_strength", 0.01),
        "l2_regularization_strength": ("l2_regularization_strength", 0.02),
        "multiply_linear_by_learning_rate": ("multiply_linear_by_learning_rate", True),
        "beta": ("beta", 0.5),
        "allow_zero_accumulator": ("allow_zero_accumulator", True),
    },
    "StochasticGradientDescentParameters": dict(COMMON),
}

BASE_RATE = 0.1  # learning_rate is required; every other field keeps its default

CASES = [
    pytest.param(cls, f.name, id=f"{cls.__name__}.{f.name}")
    for cls in CLASSES
    for f in dataclasses.fields(cls)
]


def expected_optimizer(params: parameters.OptimizationParameters) -> ec.Optimizer:
    """The embcore optimizer ``params`` stands for, from this module's table."""
    mapping = FIELDS[type(params).__name__]
    kwargs: dict[str, Any] = {}
    for f in dataclasses.fields(params):
        target, _ = mapping[f.name]
        if target != "clipvalue":
            kwargs[target] = getattr(params, f.name)
    lo, hi = params.clip_gradient_min, params.clip_gradient_max
    kwargs["clipvalue"] = None if lo is None and hi is None else (lo, hi)
    with warnings_of(params):
        return TARGET[type(params).__name__](**kwargs)


def warnings_of(params: Any) -> contextlib.AbstractContextManager:
    """``use_gradient_accumulation=False`` is accepted with a warning (warnings are errors)."""
    if params is not None and params.use_gradient_accumulation is False:
        return pytest.warns(UserWarning, match="use_gradient_accumulation=False")
    return contextlib.nullcontext()


def make(cls: type, field: str) -> parameters.OptimizationParameters:
    """``cls`` with ``field`` set to its non-default value from ``FIELDS``."""
    _, value = FIELDS[cls.__name__][field]
    kwargs = {"learning_rate": BASE_RATE, field: value}
    if field == "use_gradient_accumulation":
        with pytest.warns(UserWarning, match="use_gradient_accumulation=False"):
            return cls(**kwargs)
    return cls(**kwargs)


def engine_optimizers(spec: fc.EmbeddingConfigSpec) -> dict[str, ec.Optimizer]:
    """Build the engine as the Estimator does; each engine table's optimizer."""
    lookup = EmbeddingLookup(spec.embedding_columns, spec.table_optimizers(lambda: 0))
    assert lookup.engine is not None
    return {t.name: t.optimizer for t in lookup.engine.tables}


def assert_same_fields(got: ec.Optimizer, want: ec.Optimizer, what: str) -> None:
    assert type(got) is type(want), what
    differ = {
        f.name: (getattr(got, f.name), getattr(want, f.name))
        for f in dataclasses.fields(want)
        if getattr(got, f.name) != getattr(want, f.name)
    }
    assert differ == {}, f"{what}: fields (engine, expected) that differ: {differ}"


# --------------------------------------------------------------------------------- tests


def test_the_classes_are_the_exported_four() -> None:
    assert [c.__name__ for c in CLASSES] == sorted(TARGET)
    for cls in CLASSES:
        assert getattr(fc, cls.__name__) is cls


@pytest.mark.parametrize(("cls", "field"), CASES)
def test_every_field_has_a_mapping(cls: type, field: str) -> None:
    mapping = FIELDS.get(cls.__name__, {})
    assert field in mapping, (
        f"{cls.__name__}.{field} has no entry in FIELDS: map it to the embcore optimizer field "
        "it sets (and pass it on in the class), or make the class raise for a value embcore "
        "cannot honour"
    )
    target, value = mapping[field]
    assert target in {f.name for f in dataclasses.fields(TARGET[cls.__name__])}
    default = {f.name: f.default for f in dataclasses.fields(cls)}[field]
    assert value != default, f"{cls.__name__}.{field}: pick a value other than the default"


@pytest.mark.parametrize(("cls", "field"), CASES)
def test_every_field_reaches_the_engine_optimizer(cls: type, field: str) -> None:
    params = make(cls, field)
    want = expected_optimizer(params)
    baseline = cls(learning_rate=BASE_RATE).to_optimizer()
    target, _ = FIELDS[cls.__name__][field]
    assert getattr(want, target) != getattr(baseline, target)  # the field changes something

    assert_same_fields(params.to_optimizer(), want, f"{cls.__name__}.to_optimizer()")
    column = fc.embedding_column(fc.categorical_column_with_identity("f", 10), 4)
    spec = fc.EmbeddingConfigSpec(feature_columns=[column], optimization_parameters=params)
    (got,) = engine_optimizers(spec).values()
    assert_same_fields(got, want, f"engine optimizer of EmbeddingConfigSpec({params})")


@pytest.mark.parametrize(("cls", "field"), CASES)
def test_a_v1_tables_own_parameters_reach_its_engine_optimizer(cls: type, field: str) -> None:
    """v1 tables: the table's own parameters win over the spec's (SGD here)."""
    params = make(cls, field)
    want = expected_optimizer(params)
    spec = fc.EmbeddingConfigSpec(
        feature_to_config_dict={"f": fc.V1FeatureConfig("own"), "g": fc.V1FeatureConfig("other")},
        table_to_config_dict={
            "own": fc.V1TableConfig(10, 4, optimization_parameters=params),
            "other": fc.V1TableConfig(10, 4),
        },
        optimization_parameters=fc.StochasticGradientDescentParameters(0.3),
    )
    optimizers = engine_optimizers(spec)
    assert len(optimizers) == 2
    own = [o for name, o in optimizers.items() if "own" in name]
    other = [o for name, o in optimizers.items() if "other" in name]
    assert len(own) == len(other) == 1
    assert_same_fields(own[0], want, f"engine optimizer of a v1 table with {params}")
    assert_same_fields(other[0], ec.SGD(learning_rate=0.3), "the other table's optimizer")
