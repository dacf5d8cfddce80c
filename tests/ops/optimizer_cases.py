"""The optimizer cases every kernel backend is checked with against the reference backend."""

from __future__ import annotations

import embcore as ec

#: every optimizer, with its options (gradient clip, weight decay, weight clip, both FTRL
#: forms, non-lazy Adam, powers that are and are not +-0.5, a zero FTRL accumulator)
OPTIMIZERS = {
    "sgd": ec.SGD(learning_rate=0.1),
    "sgd_clip_decay": ec.SGD(
        learning_rate=0.1,
        clipvalue=0.05,
        weight_decay_factor=0.1,
        multiply_weight_decay_factor_by_learning_rate=True,
        clip_weight_min=-0.4,
        clip_weight_max=0.45,
    ),
    "adagrad": ec.Adagrad(learning_rate=0.1),
    "adagrad_clip_decay": ec.Adagrad(
        learning_rate=0.1, clipvalue=(None, 0.1), weight_decay_factor=0.05, clip_weight_max=0.3
    ),
    "rowwise_adagrad": ec.RowwiseAdagrad(learning_rate=0.1, epsilon=1e-3),
    "adagrad_momentum": ec.AdagradMomentum(learning_rate=0.1, momentum=0.9),
    "adagrad_momentum_nesterov": ec.AdagradMomentum(
        learning_rate=0.1, momentum=0.5, use_nesterov=True, exponent=3, beta2=0.99
    ),
    "adam": ec.Adam(learning_rate=0.1),
    "adam_non_lazy": ec.Adam(learning_rate=0.1, lazy_adam=False),
    "adam_non_lazy_clip_decay": ec.Adam(
        learning_rate=0.1, lazy_adam=False, clipvalue=(0.01, 0.5), weight_decay_factor=0.1
    ),
    "adam_eps_outside_bias_corrected": ec.Adam(
        learning_rate=0.1, sum_inside_sqrt=False, bias_correction=True
    ),
    "ftrl": ec.FTRL(
        learning_rate=0.1,
        l1_regularization_strength=0.01,
        l2_regularization_strength=0.1,
        beta=0.5,
    ),
    "ftrl_multiply_linear": ec.FTRL(
        learning_rate=0.1,
        learning_rate_power=-0.3,
        l1_regularization_strength=0.01,
        multiply_linear_by_learning_rate=True,
    ),
    "ftrl_zero_accumulator": ec.FTRL(learning_rate=0.1, initial_accumulator_value=0.0),
}
