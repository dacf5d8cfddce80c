"""EmbeddingConfigSpec validation (the seeds' ValueError/TypeError), the v1 parameter classes
and how each table's optimizer is derived."""

from __future__ import annotations

import dataclasses

import pytest

import embcore as ec
import embcore.feature_column as fc


def columns():
    a = fc.categorical_column_with_identity("a", 10)
    b = fc.categorical_column_with_identity("b", 10)
    return [fc.embedding_column(a, 4), fc.embedding_column(b, 4)]


ADAGRAD = fc.AdagradParameters(0.1)


# --------------------------------------------------------------------------- validation


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({}, ValueError, "specify feature_columns, or both"),
        ({"feature_to_config_dict": {}}, ValueError, "specify feature_columns, or both"),
        ({"feature_columns": "cols", "table_to_config_dict": {}}, ValueError, "not both"),
        ({"feature_columns": "cols"}, ValueError, "optimization_parameters is required"),
        (
            {"feature_columns": "cols", "optimization_parameters": ec.SGD},
            ValueError,
            "must be one of AdagradParameters",
        ),
        (
            {"feature_columns": "cols", "optimization_parameters": 0.1},
            ValueError,
            "must be one of AdagradParameters",
        ),
        (
            {
                "feature_columns": [fc.categorical_column_with_identity("a", 3)],
                "optimization_parameters": ADAGRAD,
            },
            TypeError,
            "must be embedding columns",
        ),
        (
            {
                "feature_columns": "cols",
                "optimization_parameters": ADAGRAD,
                "partition_strategy": "random",
            },
            ValueError,
            "'div' or 'mod'",
        ),
        (
            {"feature_columns": "cols", "optimization_parameters": ADAGRAD, "clipping_limit": -1.0},
            ValueError,
            "clipping_limit",
        ),
        (
            {
                "feature_columns": "cols",
                "optimization_parameters": ADAGRAD,
                "experimental_gradient_multiplier_fn": 2.0,
            },
            ValueError,
            "multiplier_fn",
        ),
        (
            {
                "feature_columns": "cols",
                "optimization_parameters": ADAGRAD,
                "pipeline_execution_with_tensor_core": 1,
            },
            ValueError,
            "pipeline",
        ),
    ],
)
def test_spec_errors(kwargs, error, match):
    if kwargs.get("feature_columns") == "cols":
        kwargs = {**kwargs, "feature_columns": columns()}
    with pytest.raises(error, match=match):
        fc.EmbeddingConfigSpec(**kwargs)


def test_a_feature_key_used_by_two_columns_is_an_error():
    a = fc.categorical_column_with_identity("a", 10)
    cols = [
        fc.embedding_column(a, 4),
        *fc.shared_embedding_columns([a, fc.categorical_column_with_identity("b", 10)], 4),
    ]
    with pytest.raises(ValueError, match="feature 'a' is used by two columns"):
        fc.EmbeddingConfigSpec(feature_columns=cols, optimization_parameters=ADAGRAD)


def test_two_tables_with_one_name_are_an_error():
    a = fc.categorical_column_with_identity("a", 10)
    b = fc.categorical_column_with_identity("b", 10)
    first = fc.shared_embedding_columns([a], 4, shared_embedding_collection_name="x")
    second = fc.shared_embedding_columns([b], 4, shared_embedding_collection_name="x")
    with pytest.raises(ValueError, match="two different tables are named 'tbl_x'"):
        fc.EmbeddingConfigSpec(feature_columns=first + second, optimization_parameters=ADAGRAD)


def test_dict_form_checks():
    t = fc.V1TableConfig(10, 4)
    f = fc.V1FeatureConfig("t")
    ok = fc.EmbeddingConfigSpec(
        feature_to_config_dict={"f": f},
        table_to_config_dict={"t": t},
        optimization_parameters=ADAGRAD,
    )
    (col,) = ok.embedding_columns
    assert (col.feature_key, col.table.name, col.dimension) == ("f", "t", 4)
    with pytest.raises(ValueError, match="uses table 'u'"):
        fc.EmbeddingConfigSpec(
            feature_to_config_dict={"f": fc.V1FeatureConfig("u")},
            table_to_config_dict={"t": t},
            optimization_parameters=ADAGRAD,
        )
    with pytest.raises(ValueError, match=r"tables \['u'\] are not used"):
        fc.EmbeddingConfigSpec(
            feature_to_config_dict={"f": f},
            table_to_config_dict={"t": t, "u": t},
            optimization_parameters=ADAGRAD,
        )
    with pytest.raises(TypeError, match="must be a TableConfig"):
        fc.EmbeddingConfigSpec(
            feature_to_config_dict={"f": f},
            table_to_config_dict={"t": ec.TableConfig(10, 4)},
            optimization_parameters=ADAGRAD,
        )
    with pytest.raises(TypeError, match="must be a FeatureConfig"):
        fc.EmbeddingConfigSpec(
            feature_to_config_dict={"f": ec.FeatureConfig(ec.TableConfig(2, 2))},
            table_to_config_dict={"t": t},
            optimization_parameters=ADAGRAD,
        )
    with pytest.raises(ValueError, match="unless every table has its own"):
        fc.EmbeddingConfigSpec(feature_to_config_dict={"f": f}, table_to_config_dict={"t": t})
    dense = fc.V1TableConfig(10, 4, combiner=None)
    with pytest.raises(ValueError, match="combiner=None"):
        fc.EmbeddingConfigSpec(
            feature_to_config_dict={"f": fc.V1FeatureConfig("t", 0, "w")},
            table_to_config_dict={"t": dense},
            optimization_parameters=ADAGRAD,
        )
    own = fc.V1TableConfig(10, 4, optimization_parameters=fc.AdamParameters(0.5))
    spec = fc.EmbeddingConfigSpec(feature_to_config_dict={"f": f}, table_to_config_dict={"t": own})
    assert isinstance(spec.table_optimizers(lambda: 0)(spec.embedding_columns[0].table), ec.Adam)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"vocabulary_size": 0, "dimension": 2}, "vocabulary_size"),
        ({"vocabulary_size": 2, "dimension": 0}, "dimension"),
        ({"vocabulary_size": 2, "dimension": 2, "initializer": 1}, "initializer"),
        ({"vocabulary_size": 2, "dimension": 2, "combiner": "max"}, "combiner"),
        (
            {
                "vocabulary_size": 2,
                "dimension": 2,
                "learning_rate": 0.1,
                "learning_rate_fn": lambda s: 0.1,
            },
            "at most one",
        ),
        (
            {"vocabulary_size": 2, "dimension": 2, "optimization_parameters": ec.SGD},
            "optimization_parameters",
        ),
    ],
)
def test_v1_table_config_errors(kwargs, match):
    with pytest.raises(ValueError, match=match):
        fc.V1TableConfig(**kwargs)


def test_v1_feature_config_errors():
    with pytest.raises(ValueError, match="max_sequence_length"):
        fc.V1FeatureConfig("t", -1)
    with pytest.raises(ValueError, match="weight_key"):
        fc.V1FeatureConfig("t", 0, 3)


# --------------------------------------------------------------------------- parameters


def test_parameters_map_field_by_field():
    o = fc.AdagradParameters(
        0.2, initial_accumulator=0.5, clip_gradient_min=-1.0, clip_weight_max=3.0
    ).to_optimizer()
    assert o == ec.Adagrad(
        learning_rate=0.2,
        initial_accumulator_value=0.5,
        clipvalue=(-1.0, None),
        clip_weight_max=3.0,
    )
    o = fc.AdamParameters(
        0.1,
        beta1=0.8,
        beta2=0.9,
        epsilon=1e-3,
        lazy_adam=False,
        sum_inside_sqrt=False,
        weight_decay_factor=0.01,
    ).to_optimizer()
    assert o == ec.Adam(
        learning_rate=0.1,
        beta_1=0.8,
        beta_2=0.9,
        epsilon=1e-3,
        lazy_adam=False,
        sum_inside_sqrt=False,
        weight_decay_factor=0.01,
    )
    o = fc.FtrlParameters(
        0.3,
        learning_rate_power=-0.25,
        initial_accumulator_value=0.0,
        l1_regularization_strength=0.1,
        beta=0.5,
    ).to_optimizer()
    assert o == ec.FTRL(
        learning_rate=0.3,
        learning_rate_power=-0.25,
        initial_accumulator_value=0.0,
        l1_regularization_strength=0.1,
        beta=0.5,
    )
    o = fc.StochasticGradientDescentParameters(0.4, clip_gradient_max=2.0).to_optimizer()
    assert o == ec.SGD(learning_rate=0.4, clipvalue=(None, 2.0))


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (lambda: fc.AdagradParameters(0.1, initial_accumulator=0.0), "initial_accumulator"),
        (lambda: fc.AdamParameters(0.1, beta1=1.0), "beta1"),
        (lambda: fc.AdamParameters(0.1, beta2=-0.1), "beta2"),
        (lambda: fc.AdamParameters(0.1, epsilon=0.0), "AdamParameters: .*epsilon"),
        (lambda: fc.FtrlParameters(0.1, learning_rate_power=0.5), "learning_rate_power"),
        (lambda: fc.FtrlParameters(0.1, initial_accumulator_value=-1.0), "initial_accumulator"),
        (lambda: fc.StochasticGradientDescentParameters(-0.1), "learning_rate"),
        (
            lambda: fc.StochasticGradientDescentParameters(
                0.1, clip_weight_min=2.0, clip_weight_max=1.0
            ),
            "clip_weight",
        ),
    ],
)
def test_parameter_errors(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_no_gradient_accumulation_warns_once_and_clipping_needs_it():
    with pytest.warns(UserWarning, match="always sums"):
        params = fc.AdagradParameters(0.1, use_gradient_accumulation=False)
    assert params.to_optimizer().use_gradient_accumulation is False  # no second warning
    with pytest.raises(ValueError, match="use_gradient_accumulation"):
        fc.AdagradParameters(0.1, use_gradient_accumulation=False, clip_gradient_max=1.0)


# ------------------------------------------------------------------- per-table optimizers


def test_table_optimizers_apply_clipping_rates_and_overrides():
    step = {"value": 0}
    fn = lambda s: 1.0 / (1 + s)  # noqa: E731
    a = fc.categorical_column_with_identity("a", 10)
    b = fc.categorical_column_with_identity("b", 10)
    cols = [fc.embedding_column(a, 4, learning_rate_fn=fn), fc.embedding_column(b, 4)]
    spec = fc.EmbeddingConfigSpec(
        feature_columns=cols,
        optimization_parameters=fc.StochasticGradientDescentParameters(
            0.5, clip_gradient_min=-3.0, clip_gradient_max=0.2
        ),
        clipping_limit=1.0,
    )
    for_table = spec.table_optimizers(lambda: step["value"])
    opt_a, opt_b = for_table(cols[0].table), for_table(cols[1].table)
    assert opt_b.learning_rate == 0.5
    assert opt_a.clipvalue == opt_b.clipvalue == (-1.0, 0.2)  # the intersection
    assert callable(opt_a.learning_rate) and opt_a.learning_rate() == 1.0
    step["value"] = 3
    assert opt_a.learning_rate() == 0.25
    # The same function object gives the same closure: the engine calls it once a step.
    c = fc.embedding_column(fc.categorical_column_with_identity("c", 10), 4, learning_rate_fn=fn)
    assert for_table(c.table).learning_rate is opt_a.learning_rate


def test_v1_zero_learning_rate_is_honoured():
    # docs/semantics.md §6 pitfall 26: 0.0 is not "unset"
    t = fc.V1TableConfig(10, 4, learning_rate=0.0)
    spec = fc.EmbeddingConfigSpec(
        feature_to_config_dict={"f": fc.V1FeatureConfig("t")},
        table_to_config_dict={"t": t},
        optimization_parameters=fc.AdagradParameters(0.1),
    )
    optimizer = spec.table_optimizers(lambda: 0)(spec.embedding_columns[0].table)
    assert optimizer.learning_rate == 0.0
    assert (
        dataclasses.replace(optimizer, learning_rate=0.1)
        == fc.AdagradParameters(0.1).to_optimizer()
    )


def test_embcore_optimizers_are_accepted_and_clipped():
    spec = fc.EmbeddingConfigSpec(
        feature_columns=columns(),
        optimization_parameters=ec.Adagrad(learning_rate=0.3),
        clipping_limit=0.5,
    )
    o = spec.table_optimizers(lambda: 0)(spec.embedding_columns[0].table)
    assert o == ec.Adagrad(learning_rate=0.3, clipvalue=(-0.5, 0.5))
    assert spec.tensor_core_feature_columns == ()
