"""An independent NumPy float64 model of the engine, written from docs/semantics.md §2 and §3.

Nothing here imports embcore: the tests compare the engine against these formulas.

A batch of one feature is described as a list of *samples* (docs/semantics.md §2.1); each sample is
a list of ``(id, weight)`` pairs. Sequence features are samples of at most one id each, combined
with ``"sum"`` (every position is its own sample).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

Sample = list[tuple[int, float]]

SLOT_NAMES: dict[str, tuple[str, ...]] = {
    "sgd": (),
    "adagrad": ("accumulators",),
    "adagrad_momentum": ("accumulators", "momenta"),
    "adam": ("momenta", "velocities"),
    "ftrl": ("accumulators", "linears"),
    "rowwise_adagrad": ("accumulators",),
}


# ---------------------------------------------------------------------------------- lookups


def sample_gains(sample: Sample, combiner: str) -> np.ndarray:
    """docs/semantics.md §2.1/§2.3: gain_j = w_j * scale, scale 1 (sum), 1/sum(w) (mean), 1/sqrt(sum
    w^2) (sqrtn), and 0 when that denominator is 0."""
    w = np.array([weight for _, weight in sample], dtype=np.float64)
    if combiner == "sum":
        return w
    denom = w.sum() if combiner == "mean" else np.sqrt((w * w).sum())
    if denom == 0:
        return np.zeros_like(w)
    return w / denom


def lookup(table: np.ndarray, samples: Sequence[Sample], combiner: str) -> np.ndarray:
    """``(S, dim)`` activations: ``act[s] = sum_j gain_j * table[id_j]``; empty samples are 0."""
    table = np.asarray(table, dtype=np.float64)
    out = np.zeros((len(samples), table.shape[1]))
    for s, sample in enumerate(samples):
        for (row, _), gain in zip(sample, sample_gains(sample, combiner), strict=True):
            out[s] += gain * table[row]
    return out


def row_gradients(
    vocab: int,
    dim: int,
    features: Sequence[tuple[Sequence[Sample], str, np.ndarray]],
) -> tuple[np.ndarray, np.ndarray]:
    """docs/semantics.md §3.1: sum ``gain * dL/dact[s]`` over every occurrence of every row, over
    all the features ``(samples, combiner, grad (S, dim))`` of one table.

    Returns:
        ``(vocab, dim)`` summed gradients and a ``(vocab,)`` bool mask of touched rows.
    """
    grad = np.zeros((vocab, dim))
    touched = np.zeros(vocab, dtype=bool)
    for samples, combiner, act_grad in features:
        act_grad = np.asarray(act_grad, dtype=np.float64).reshape(len(samples), dim)
        for s, sample in enumerate(samples):
            for (row, _), gain in zip(sample, sample_gains(sample, combiner), strict=True):
                grad[row] += gain * act_grad[s]
                touched[row] = True
    return grad, touched


# ------------------------------------------------------------------------------- optimizers


def initial_slots(kind: str, hp: dict[str, Any], vocab: int, dim: int) -> dict[str, np.ndarray]:
    """docs/semantics.md §1.3-§1.6: slot shapes and initial values."""
    full = (vocab, dim)
    if kind == "sgd":
        return {}
    if kind == "adagrad":
        return {"accumulators": np.full(full, hp.get("initial_accumulator_value", 0.1))}
    if kind == "adagrad_momentum":
        return {"accumulators": np.zeros(full), "momenta": np.zeros(full)}
    if kind == "adam":
        return {"momenta": np.zeros(full), "velocities": np.zeros(full)}
    if kind == "ftrl":
        return {
            "accumulators": np.full(full, hp.get("initial_accumulator_value", 0.1)),
            "linears": np.zeros(full),
        }
    if kind == "rowwise_adagrad":
        return {"accumulators": np.full(vocab, hp.get("initial_accumulator_value", 0.1))}
    raise ValueError(kind)


def is_lazy(kind: str, hp: dict[str, Any]) -> bool:
    return not (kind == "adam" and hp.get("lazy_adam", True) is False)


def _rule(
    kind: str,
    hp: dict[str, Any],
    w: np.ndarray,
    s: dict[str, np.ndarray],
    g: np.ndarray,
    lr: float,
    t: int,
) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """The optimizer's own update on the rows given (docs/semantics.md §3.2-§3.7)."""
    if kind == "sgd":  # 3.2
        return w - lr * g, {}
    if kind == "adagrad":  # 3.3
        acc = s["accumulators"] + g**2
        return w - lr * g / np.sqrt(acc), {"accumulators": acc}
    if kind == "adagrad_momentum":  # 3.4
        beta2 = hp.get("beta2", 1.0)
        momentum = hp.get("momentum", 0.0)
        eps = hp.get("epsilon", 1e-10)
        exponent = hp.get("exponent", 2.0)
        if beta2 == 1:
            acc = s["accumulators"] + g**2
        else:
            acc = beta2 * s["accumulators"] + (1 - beta2) * g**2
        scaled = g * (acc + eps) ** (-1.0 / exponent)
        m = momentum * s["momenta"] + scaled
        upd = momentum * m + scaled if hp.get("use_nesterov", False) else m
        return w - lr * upd, {"accumulators": acc, "momenta": m}
    if kind == "adam":  # 3.6, plus pitfall 18's optional bias correction
        b1, b2 = hp.get("beta_1", 0.9), hp.get("beta_2", 0.999)
        eps = hp.get("epsilon", 1e-7)
        if hp.get("bias_correction", False):
            lr = lr * np.sqrt(1 - b2**t) / (1 - b1**t)
        m = b1 * s["momenta"] + (1 - b1) * g
        v = b2 * s["velocities"] + (1 - b2) * g**2
        if hp.get("sum_inside_sqrt", True):
            step = m / np.sqrt(v + eps**2)
        else:
            step = m / (np.sqrt(v) + eps)
        return w - lr * step, {"momenta": m, "velocities": v}
    if kind == "ftrl":  # 3.7
        p = -hp.get("learning_rate_power", -0.5)
        l1 = hp.get("l1_regularization_strength", 0.0)
        l2 = hp.get("l2_regularization_strength", 0.0)
        beta = hp.get("beta", 0.0)
        acc = s["accumulators"]
        acc_new = acc + g**2
        delta = acc_new**p - acc**p
        if hp.get("multiply_linear_by_learning_rate", False):
            lin = s["linears"] + lr * g - delta * w
            limit = lr * l1
            quad = acc_new**p + beta + 2 * lr * l2
        else:
            lin = s["linears"] + g - delta / lr * w
            limit = l1
            quad = (acc_new**p + beta) / lr + 2 * l2
        # "= 0 if |lin| <= l1, else (sign(lin) * l1 - lin) / quad" (docs/semantics.md §3.7)
        with np.errstate(divide="ignore", invalid="ignore"):
            shrunk = (np.sign(lin) * limit - lin) / quad
        new_w = np.where(np.abs(lin) <= limit, 0.0, shrunk)
        return new_w, {"accumulators": acc_new, "linears": lin}
    if kind == "rowwise_adagrad":
        eps = hp.get("epsilon", 0.0)
        acc = s["accumulators"] + (g**2).mean(axis=1)
        return w - lr * g / (np.sqrt(acc) + eps)[:, None], {"accumulators": acc}
    raise ValueError(kind)


def _clip_range(clipvalue: Any) -> tuple[float, float]:
    if isinstance(clipvalue, (tuple, list)):
        lo, hi = clipvalue
        return (-np.inf if lo is None else lo, np.inf if hi is None else hi)
    return (-clipvalue, clipvalue)


def apply_update(
    kind: str,
    hp: dict[str, Any],
    table: np.ndarray,
    slots: dict[str, np.ndarray],
    grad: np.ndarray,
    touched: np.ndarray,
    lr: float,
    t: int,
) -> None:
    """One step of docs/semantics.md §3.1 on a whole table, in place: clip g, decay, rule, clip w.

    Lazy optimizers update the touched rows only; non-lazy Adam updates every row, the
    untouched ones with ``g = 0`` (docs/semantics.md §3.6).
    """
    rows = np.nonzero(touched)[0] if is_lazy(kind, hp) else np.arange(table.shape[0])
    if rows.size == 0:
        return
    g = grad[rows]
    if hp.get("clipvalue") is not None:
        lo, hi = _clip_range(hp["clipvalue"])
        g = np.clip(g, lo, hi)
    w = table[rows]
    if hp.get("weight_decay_factor"):
        wd = hp["weight_decay_factor"] * (
            lr if hp.get("multiply_weight_decay_factor_by_learning_rate") else 1.0
        )
        w = w - wd * w
    w, new_slots = _rule(kind, hp, w, {k: v[rows] for k, v in slots.items()}, g, lr, t)
    lo = hp.get("clip_weight_min")
    hi = hp.get("clip_weight_max")
    if lo is not None or hi is not None:
        w = np.clip(w, -np.inf if lo is None else lo, np.inf if hi is None else hi)
    table[rows] = w
    for name, value in new_slots.items():
        slots[name][rows] = value


def safe_prune(samples: Sequence[Sample], combiner: str) -> list[Sample]:
    """docs/semantics.md §2.8 (``safe_embedding_lookup_sparse``): drop ids < 0 and, unless the
    combiner is sum, ids whose weight is <= 0. Samples left empty look up zeros."""
    return [
        [(i, w) for i, w in sample if i >= 0 and (combiner == "sum" or w > 0)] for sample in samples
    ]
