"""A one-process engine on the CPU backend checks its gradients for NaN and Inf inside the
update's own pass over them (the dedup), not in a separate pass; where the check must come
first (pipelined updates, callable learning rates, other row storage) the separate pass runs.
Either way the policy is the same: a bad gradient changes no table, and raises naming its
feature or is skipped and counted (docs/cpu_backend.md, "The finiteness check inside the
dedup")."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

import embcore as ec
from embcore.ops.cpu import finite


@pytest.fixture
def passes(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """Counts the calls of the separate finiteness pass's kernel."""
    calls: list[int] = []
    kernel = finite.non_finite_flags

    def counted(*args):  # type: ignore[no-untyped-def]
        calls.append(1)
        return kernel(*args)

    monkeypatch.setattr(finite, "non_finite_flags", counted)
    yield calls


def engine(learning_rate=0.1, **options) -> ec.EmbeddingEngine:  # type: ignore[no-untyped-def]
    video = ec.TableConfig(vocabulary_size=10, dim=4, name="video")
    user = ec.TableConfig(vocabulary_size=6, dim=3, name="user", combiner="mean")
    features = {
        "watched": ec.FeatureConfig(table=video),
        "favorited": ec.FeatureConfig(table=video, max_sequence_length=3),
        "friends": ec.FeatureConfig(table=user),
    }
    return ec.EmbeddingEngine(
        features, optimizer=ec.Adagrad(learning_rate=learning_rate), backend="cpu", **options
    )


def batch() -> dict:
    return {
        "watched": torch.tensor([1, 2, 3]),
        "favorited": ec.RaggedIds.from_lists([[1, 2], [], [9]]),
        "friends": ec.RaggedIds.from_lists([[0, 5], [1], []]),  # sample 2: an empty bag
    }


def snapshot(emb: ec.EmbeddingEngine) -> dict:
    return {k: v.clone() for k, v in emb.state_dict().items()}


def same(emb: ec.EmbeddingEngine, before: dict) -> bool:
    return all(torch.equal(v, emb.state_dict()[k]) for k, v in before.items())


def train(emb: ec.EmbeddingEngine, spoil=None, acts=None) -> dict:  # type: ignore[no-untyped-def]
    """One ``apply_gradients`` step of 0.5s (``spoil``: changes them first); its
    activations (when the step raises, pass them back as ``acts`` to retry the batch)."""
    if acts is None:
        emb.enqueue(batch())
        acts = emb.dequeue()
    grads = {k: torch.full_like(v, 0.5) for k, v in acts.items()}
    if spoil is not None:
        spoil(grads)
    emb.apply_gradients(grads)
    return acts


def test_a_local_engine_checks_within_the_update(passes):
    emb = engine()
    train(emb)
    (emb(batch())["watched"].sum()).backward()
    assert passes == [] and emb.step == 2
    reference = ec.EmbeddingEngine(
        {f.name: f.config for f in emb.features},
        optimizer=ec.Adagrad(learning_rate=0.1),
        backend="reference",
    )
    train(reference)
    (reference(batch())["watched"].sum()).backward()
    for k, v in reference.state_dict().items():
        torch.testing.assert_close(emb.state_dict()[k], v)


@pytest.mark.parametrize(
    "options",
    [{"pipeline": True}, {"learning_rate": lambda: 0.1}],
    ids=["pipelined", "callable-rate"],
)
def test_the_separate_pass_runs_where_the_check_must_come_first(passes, options):
    emb = engine(**options)
    train(emb)
    assert passes


def nan_at(feature: str, index: tuple):  # type: ignore[no-untyped-def]
    def spoil(grads: dict) -> None:
        grads[feature][index] = float("nan")

    return spoil


# a row the dedup sums, a padded sequence position and an empty bag (rows nothing sums)
PLACES = [("watched", (0, 1)), ("favorited", (1, 0, 2)), ("friends", (2, 0))]


@pytest.mark.parametrize(("feature", "index"), PLACES, ids=[p[0] for p in PLACES])
def test_raise_names_the_feature_and_changes_nothing(passes, feature, index):
    emb = engine()
    before = snapshot(emb)
    emb.enqueue(batch())
    acts = emb.dequeue()
    with pytest.raises(ValueError, match=rf"features '{feature}' \(table '\w+'\) have NaN"):
        train(emb, nan_at(feature, index), acts)
    assert same(emb, before) and emb.step == 0 and emb.skipped_steps == 0
    train(emb, acts=acts)  # the batch stays pending; finite gradients apply
    assert emb.step == 1 and not same(emb, before)


@pytest.mark.parametrize(("feature", "index"), PLACES, ids=[p[0] for p in PLACES])
def test_skip_drops_and_counts_the_step(feature, index):
    emb = engine(non_finite_gradients="skip")
    before = snapshot(emb)
    train(emb, nan_at(feature, index))
    assert same(emb, before) and emb.step == 0 and emb.skipped_steps == 1
    train(emb)
    assert emb.step == 1 and not same(emb, before)
