"""``load_state_dict`` with keys missing or unexpected: ``strict=False`` loads every entry
present and reports the rest (as torch's modules do), ``strict=True`` raises and loads nothing.
Loaded values are checked against the NumPy arrays the state dict was built from."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

import embcore as ec


def make_engine(dynamic: bool = False) -> ec.EmbeddingEngine:
    video = ec.TableConfig(vocabulary_size=10, dim=4, name="video")
    user = ec.TableConfig(vocabulary_size=6, dim=3, name="user", combiner="sum")
    features = {"watched": ec.FeatureConfig(table=video), "friends": ec.FeatureConfig(table=user)}
    if dynamic:
        seen = ec.TableConfig(None, 2, name="seen")
        features["clicked"] = ec.FeatureConfig(table=seen)
    return ec.EmbeddingEngine(features, optimizer=ec.Adagrad(learning_rate=0.1))


def random_state(emb: ec.EmbeddingEngine, seed: int = 0) -> dict[str, np.ndarray]:
    """A value for every key of ``emb``'s state dict (same shapes, new numbers)."""
    rng = np.random.default_rng(seed)
    state = {}
    for key, value in emb.state_dict().items():
        if key == "step":
            state[key] = np.array(7, np.int64)
        else:
            state[key] = rng.uniform(0.1, 1.0, size=tuple(value.shape)).astype(np.float32)
    return state


def tensors(state: dict[str, np.ndarray]) -> dict[str, torch.Tensor]:
    return {k: torch.from_numpy(v.copy()) for k, v in state.items()}


def current(emb: ec.EmbeddingEngine) -> dict[str, np.ndarray]:
    return {k: v.detach().clone().numpy() for k, v in emb.state_dict().items()}


def test_non_strict_load_with_a_missing_key_loads_the_rest():
    emb = make_engine()
    before = current(emb)
    state = random_state(emb)
    given = tensors({k: v for k, v in state.items() if k != "user.weight"})
    result = emb.load_state_dict(given, strict=False)
    assert result.missing_keys == ["user.weight"] and result.unexpected_keys == []
    after = current(emb)
    np.testing.assert_array_equal(after["user.weight"], before["user.weight"])  # kept
    for key in ("video.weight", "video.accumulators", "user.accumulators", "step"):
        np.testing.assert_array_equal(after[key], state[key], err_msg=key)
    assert emb.step == 7


def test_non_strict_load_with_unexpected_keys_loads_everything_and_reports_them():
    emb = make_engine()
    state = random_state(emb, seed=1)
    given = tensors(state) | {"user.momenta": torch.ones(6, 3), "clicks.weight": torch.ones(2)}
    result = emb.load_state_dict(given, strict=False)
    assert result.missing_keys == []
    assert sorted(result.unexpected_keys) == ["clicks.weight", "user.momenta"]
    after = current(emb)
    for key, value in state.items():
        np.testing.assert_array_equal(after[key], value, err_msg=key)


@pytest.mark.parametrize("change", ["missing", "unexpected"])
def test_strict_load_with_a_key_missing_or_unexpected_raises_and_loads_nothing(change):
    emb = make_engine()
    before = current(emb)
    state = tensors(random_state(emb, seed=2))
    if change == "missing":
        del state["video.accumulators"]
    else:
        state["video.momenta"] = torch.ones(10, 4)
    with pytest.raises(
        RuntimeError, match=r"(Missing|Unexpected) key.*video\.(accumulators|momenta)"
    ):
        emb.load_state_dict(state)
    after = current(emb)
    for key, value in before.items():
        np.testing.assert_array_equal(after[key], value, err_msg=key)


def test_non_strict_load_still_refuses_a_wrong_shape_and_loads_nothing():
    emb = make_engine()
    before = current(emb)
    state = tensors(random_state(emb, seed=3))
    del state["user.weight"]
    state["video.weight"] = torch.zeros(9, 4)
    with pytest.raises(
        RuntimeError, match=r"video\.weight: expected shape \(10, 4\), got \(9, 4\)"
    ):
        emb.load_state_dict(state, strict=False)
    after = current(emb)
    for key, value in before.items():
        np.testing.assert_array_equal(after[key], value, err_msg=key)


def test_engine_inside_a_model_loads_what_a_non_strict_load_gives_it():
    model = nn.Module()
    model.emb = make_engine()
    model.head = nn.Linear(2, 1)
    state = random_state(model.emb, seed=4)
    given = {f"emb.{k}": v for k, v in tensors(state).items() if k != "video.accumulators"}
    result = model.load_state_dict(given, strict=False)
    assert sorted(result.missing_keys) == ["emb.video.accumulators", "head.bias", "head.weight"]
    assert result.unexpected_keys == []
    after = current(model.emb)
    for key in ("video.weight", "user.weight", "user.accumulators", "step"):
        np.testing.assert_array_equal(after[key], state[key], err_msg=key)
    # a model's dense part alone (an engine loaded elsewhere) leaves the engine as it was
    before = current(model.emb)
    dense = {k: torch.zeros_like(v) for k, v in model.head.state_dict(prefix="head.").items()}
    result = model.load_state_dict(dense, strict=False)
    assert len(result.missing_keys) == len(before)
    after = current(model.emb)
    for key, value in before.items():
        np.testing.assert_array_equal(after[key], value, err_msg=key)


def test_non_strict_load_of_a_dynamic_table_is_whole_or_nothing():
    source = make_engine(dynamic=True)
    source(
        {
            "watched": torch.tensor([1]),
            "friends": torch.tensor([2]),
            "clicked": torch.tensor([-5, 40]),
        }
    )
    state = {k: v.detach().clone() for k, v in source.state_dict().items()}
    assert state["seen.keys"].tolist() == [-5, 40]
    fixed = random_state(make_engine(), seed=5)

    emb = make_engine(dynamic=True)  # the dynamic table absent: the fixed ones load
    result = emb.load_state_dict(tensors(fixed), strict=False)
    assert "seen.keys" in result.missing_keys and "seen.weight" in result.missing_keys
    assert emb.table_keys("seen").numel() == 0
    after = current(emb)
    for key, value in fixed.items():
        np.testing.assert_array_equal(after[key], value, err_msg=key)

    whole = make_engine(dynamic=True)  # the dynamic table whole: it loads too
    seen = {k: v for k, v in state.items() if k.startswith("seen.")}
    result = whole.load_state_dict(tensors(fixed) | seen, strict=False)
    assert result.missing_keys == [] and result.unexpected_keys == []
    assert whole.table_keys("seen").tolist() == [-5, 40]
    np.testing.assert_array_equal(current(whole)["seen.weight"], seen["seen.weight"].numpy())

    partial = make_engine(dynamic=True)  # keys without rows: refused, nothing loaded
    before = current(partial)
    given = tensors(fixed) | {k: v for k, v in seen.items() if k != "seen.weight"}
    with pytest.raises(RuntimeError, match=r"seen: a dynamic table loads whole.*seen\.weight"):
        partial.load_state_dict(given, strict=False)
    after = current(partial)
    for key, value in before.items():
        np.testing.assert_array_equal(after[key], value, err_msg=key)


def test_engine_inside_a_model_under_a_strict_load_raises_as_torch_does():
    """torch tells a submodule nothing of the outer call's ``strict``: the engine loads what
    is present, like torch's own modules, and the outer call raises for the missing key."""
    model = nn.Module()
    model.emb = make_engine()
    state = random_state(model.emb, seed=6)
    given = {f"emb.{k}": v for k, v in tensors(state).items() if k != "user.weight"}
    with pytest.raises(RuntimeError, match=r"Missing key.*emb\.user\.weight"):
        model.load_state_dict(given)
    np.testing.assert_array_equal(current(model.emb)["video.weight"], state["video.weight"])
