"""Every bad input of issue 2 point 5 raises a clear error and leaves all state unchanged."""

from __future__ import annotations

import pytest
import torch

import embcore as ec


def make_engine(optimizer=None):
    video = ec.TableConfig(vocabulary_size=10, dim=4, name="video")
    user = ec.TableConfig(vocabulary_size=6, dim=3, name="user", combiner="sum")
    features = {
        "watched": ec.FeatureConfig(table=video),
        "favorited": ec.FeatureConfig(table=video, max_sequence_length=3),
        "friends": ec.FeatureConfig(table=user),
    }
    return ec.EmbeddingEngine(features, optimizer=optimizer or ec.Adam(learning_rate=0.1))


def good_batch():
    return {
        "watched": torch.tensor([1, 2, 3]),
        "favorited": ec.RaggedIds.from_lists([[1, 2], [], [9]]),
        "friends": ec.RaggedIds.from_lists([[0, 5], [1], []]),
    }


def snapshot(emb):
    return {k: v.clone() for k, v in emb.state_dict().items()}


def assert_unchanged(emb, before):
    after = emb.state_dict()
    assert after.keys() == before.keys()
    for key, value in before.items():
        assert torch.equal(after[key], value), key


def sparse(indices, values, shape):
    return torch.sparse_coo_tensor(
        torch.tensor(indices).T, torch.tensor(values), shape, check_invariants=True
    )


BAD_INPUTS = [
    pytest.param(
        {"watched": torch.tensor([1, 10, 3])},
        None,
        ValueError,
        r"feature 'watched': id 10 .* table 'video' with vocabulary_size 10",
        id="id-too-large",
    ),
    pytest.param(
        {"friends": ec.RaggedIds.from_lists([[0, -2], [1], []])},
        None,
        ValueError,
        r"feature 'friends': id -2 .*safe_lookup",
        id="negative-id",
    ),
    pytest.param(
        {"watched": torch.tensor([1.0, 2.0, 3.0])},
        None,
        TypeError,
        r"feature 'watched': ids must be integers.*torch.float32",
        id="float-ids",
    ),
    pytest.param(
        {},
        {"watched": torch.ones(3)},
        ValueError,
        r"feature 'watched': weights were given for dense input",
        id="weights-on-dense",
    ),
    pytest.param(
        {"favorited": torch.tensor([1, 2, 3])},
        None,
        ValueError,
        r"feature 'favorited' is a sequence feature \(max_sequence_length=3\) but a dense",
        id="sequence-fed-dense",
    ),
    pytest.param(
        {"watched": torch.tensor([[1, 2], [3, 4]])},
        None,
        ValueError,
        r"feature 'watched': dense ids of rank >= 2 must end in a dimension of 1.*\(2, 2\)",
        id="dense-rank2-not-1",
    ),
    pytest.param(
        {},
        {"friends": ec.RaggedIds.from_lists([[1.0], [1.0, 2.0], []])},
        ValueError,
        r"feature 'friends': weights are not aligned with ids",
        id="ragged-weights-misaligned",
    ),
    pytest.param(
        {"friends": sparse([[0, 0], [1, 0]], [1, 2], (3, 2))},
        {"friends": sparse([[0, 1], [1, 0]], [1.0, 2.0], (3, 2))},
        ValueError,
        r"feature 'friends': weights are not aligned with ids",
        id="sparse-weights-misaligned",
    ),
    pytest.param(
        {},
        {
            "friends": ec.RaggedIds(
                torch.tensor([0.1, 0.2], dtype=torch.float64), torch.tensor([0, 2, 2, 2])
            )
        },
        ValueError,
        r"not aligned|row_splits",
        id="ragged-weights-other-splits",
    ),
    pytest.param(
        {},
        {
            "friends": ec.RaggedIds(
                torch.tensor([0.1, 0.2, 0.3], dtype=torch.float64), torch.tensor([0, 2, 3, 3])
            )
        },
        TypeError,
        r"feature 'friends': weights of dtype torch.float64 are not exactly representable.*0.1",
        id="float64-weights-lossy",
    ),
    pytest.param(
        {},
        {
            "friends": ec.RaggedIds(
                torch.tensor([1.0, float("nan"), 1.0]), torch.tensor([0, 2, 3, 3])
            )
        },
        ValueError,
        r"feature 'friends': weights must be finite, got nan",
        id="nan-weights",
    ),
    pytest.param(
        {"watched": [1, 2, 3]},
        None,
        TypeError,
        r"feature 'watched': expected a dense integer tensor.*got list",
        id="unknown-input-kind",
    ),
]


@pytest.mark.parametrize(("override", "weights", "error", "message"), BAD_INPUTS)
@pytest.mark.parametrize("style", ["enqueue", "forward"])
def test_bad_input_raises_and_changes_nothing(override, weights, error, message, style):
    emb = make_engine()
    emb.enqueue(good_batch())  # a first good step, so that slots are not at their initial values
    acts = emb.dequeue()
    emb.apply_gradients({k: torch.ones_like(v) for k, v in acts.items()})
    before = snapshot(emb)
    batch = good_batch() | override
    with pytest.raises(error, match=message):
        if style == "enqueue":
            emb.enqueue(batch, weights=weights)
        else:
            emb(batch, weights=weights)
    assert_unchanged(emb, before)
    # the engine is still usable: a good step goes through after the error
    emb.enqueue(good_batch())
    emb.apply_gradients({k: torch.ones_like(v) for k, v in emb.dequeue().items()})
    assert emb.step == 2


def test_lossless_weights_are_converted():
    emb = make_engine()
    w64 = ec.RaggedIds(
        torch.tensor([0.5, 2.0, 1.0], dtype=torch.float64), torch.tensor([0, 2, 3, 3])
    )
    wint = ec.RaggedIds(torch.tensor([1, 3, 2]), torch.tensor([0, 2, 3, 3]))
    w32 = ec.RaggedIds(torch.tensor([0.5, 2.0, 1.0]), torch.tensor([0, 2, 3, 3]))
    a = emb.eval()(good_batch(), weights={"friends": w64})["friends"]
    b = emb.eval()(good_batch(), weights={"friends": w32})["friends"]
    assert torch.equal(a, b)
    c = emb.eval()(good_batch(), weights={"friends": wint})["friends"]
    table = emb.embedding_tables["user"]
    torch.testing.assert_close(c[0], table[0] + 3 * table[5])


@pytest.mark.parametrize(
    ("batch", "error", "message"),
    [
        ({"watched": torch.tensor([1])}, ValueError, r"missing \['favorited', 'friends'\]"),
        (good_batch() | {"extra": torch.tensor([1])}, ValueError, r"unknown \['extra'\]"),
        ([torch.tensor([1])], TypeError, "expected a dict"),
    ],
)
def test_structure_errors_name_the_features(batch, error, message):
    emb = make_engine()
    with pytest.raises(error, match=message):
        emb.enqueue(batch)


def test_apply_without_training_enqueue():
    emb = make_engine()
    with pytest.raises(RuntimeError, match="no training batch"):
        emb.apply_gradients({})
    emb.enqueue(good_batch(), training=False)
    acts = emb.dequeue()
    with pytest.raises(RuntimeError, match="no training batch"):
        emb.apply_gradients({k: torch.ones_like(v) for k, v in acts.items()})


def test_apply_before_dequeue_and_dequeue_without_enqueue():
    emb = make_engine()
    with pytest.raises(RuntimeError, match="call enqueue"):
        emb.dequeue()
    emb.enqueue(good_batch())
    with pytest.raises(RuntimeError, match="call dequeue"):
        emb.apply_gradients({})


def test_two_training_enqueues_without_apply():
    emb = make_engine()
    emb.enqueue(good_batch())
    with pytest.raises(RuntimeError, match="previous training batch has not been applied"):
        emb.enqueue(good_batch())
    emb.dequeue()
    with pytest.raises(RuntimeError, match="previous training batch has not been applied"):
        emb.enqueue(good_batch(), training=False)


def test_inference_enqueue_must_be_dequeued_before_the_next():
    emb = make_engine()
    emb.enqueue(good_batch(), training=False)
    with pytest.raises(RuntimeError, match="never dequeued"):
        emb.enqueue(good_batch(), training=False)


@pytest.mark.parametrize(
    ("grads", "error", "message"),
    [
        (lambda a: a | {"watched": torch.ones(3, 5)}, ValueError, r"'watched'.*\(3, 4\).*\(3, 5\)"),
        (lambda a: a | {"favorited": torch.ones(3, 4)}, ValueError, r"'favorited'.*\(3, 3, 4\)"),
        (lambda a: a | {"friends": [1.0]}, ValueError, r"'friends': found non-tensor type list"),
        (lambda a: a | {"friends": torch.ones(3, 3, dtype=torch.int64)}, TypeError, "float"),
        (
            lambda a: a | {"friends": torch.full((3, 3), float("inf"))},
            ValueError,
            r"features 'friends' \(table 'user'\) have NaN or Inf",
        ),
        (lambda a: {"watched": a["watched"]}, ValueError, "missing"),
        (lambda a: list(a.values()), TypeError, "expected a dict"),
    ],
)
def test_bad_gradients_raise_and_change_nothing(grads, error, message):
    emb = make_engine()
    before = snapshot(emb)
    emb.enqueue(good_batch())
    acts = {k: torch.ones_like(v) for k, v in emb.dequeue().items()}
    with pytest.raises(error, match=message):
        emb.apply_gradients(grads(acts))
    assert_unchanged(emb, before)
    emb.apply_gradients(acts)  # the batch stays pending; fixed gradients apply
    assert emb.step == 1


def test_training_needs_an_optimizer_but_lookup_does_not():
    t = ec.TableConfig(vocabulary_size=5, dim=2, name="frozen")
    emb = ec.EmbeddingEngine({"f": ec.FeatureConfig(table=t)})
    with pytest.raises(RuntimeError, match=r"tables \['frozen'\] have no optimizer"):
        emb.enqueue({"f": torch.tensor([1])})
    emb.enqueue({"f": torch.tensor([1])}, training=False)
    assert emb.dequeue()["f"].shape == (1, 2)
    out = emb({"f": torch.tensor([1, 2])})  # training mode, but nothing to train
    assert not out["f"].requires_grad


def test_backward_twice_through_one_lookup_is_refused():
    emb = make_engine(ec.SGD(learning_rate=1.0))
    acts = emb(good_batch())
    loss = sum(a.sum() for a in acts.values())
    loss.backward(retain_graph=True)
    after_one = snapshot(emb)
    with pytest.raises(RuntimeError, match="backward ran twice"):
        loss.backward()
    assert_unchanged(emb, after_one)


def test_load_state_dict_with_a_bad_shape_loads_nothing():
    emb = make_engine()
    before = snapshot(emb)
    sd = {k: v + 1 for k, v in before.items()}
    sd["user.weight"] = torch.zeros(7, 3)
    with pytest.raises(RuntimeError, match=r"user.weight: expected shape \(6, 3\), got \(7, 3\)"):
        emb.load_state_dict(sd)
    assert_unchanged(emb, before)
    missing = {k: v for k, v in sd.items() if k != "user.weight"}
    with pytest.raises(RuntimeError, match="Missing key"):
        emb.load_state_dict(missing)
    assert_unchanged(emb, before)


@pytest.mark.parametrize("style", ["enqueue", "forward"])
def test_non_finite_gradients_skip_policy_drops_and_counts(style):
    video = ec.TableConfig(vocabulary_size=10, dim=4, name="video")
    emb = ec.EmbeddingEngine(
        {"f": ec.FeatureConfig(table=video)},
        optimizer=ec.Adam(learning_rate=0.1),
        non_finite_gradients="skip",
    )
    before = snapshot(emb)
    batch = {"f": torch.tensor([1, 2])}
    bad = torch.tensor([[float("nan")] * 4, [1.0] * 4])
    if style == "enqueue":
        emb.enqueue(batch)
        emb.dequeue()
        emb.apply_gradients({"f": bad})
    else:
        (emb(batch)["f"] * bad).sum().backward()
    assert emb.skipped_steps == 1 and emb.step == 0
    assert_unchanged(emb, before)
    emb.enqueue(batch)  # the skipped batch is consumed; training goes on
    emb.apply_gradients({"f": torch.ones_like(emb.dequeue()["f"])})
    assert emb.step == 1


def test_non_finite_policy_is_validated():
    video = ec.TableConfig(vocabulary_size=10, dim=4)
    with pytest.raises(ValueError, match="'ignore'"):
        ec.EmbeddingEngine({"f": ec.FeatureConfig(table=video)}, non_finite_gradients="ignore")
