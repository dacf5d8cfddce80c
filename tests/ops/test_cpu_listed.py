"""Multi-id tables in the CPU backend: the dedup into occurrence lists (``ops/cpu/occurrences``)
and the forward's four-ids-at-a-time pooling.

A table with at least twice as many ids as samples is deduplicated into occurrence lists, and
its rule sums each chunk of rows from them (row-wise Adagrad's ``update_listed``). These tests
pin that the path is taken where it should be, that its results are the summed-block path's
to the bit (the same sums in the same order) and the reference's within float32 rounding, and
that a bad id or a non-finite gradient still changes no table.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
import torch
from test_cpu_backend import assert_states_match, copy_state, make_state, touched_in_any

import embcore as ec
from embcore.inputs import FeatureBatch
from embcore.ops import cpu, reference
from embcore.ops.state import TableState

ROWWISE = {
    "plain": ec.RowwiseAdagrad(learning_rate=0.1),
    "clipped": ec.RowwiseAdagrad(
        learning_rate=0.1,
        clipvalue=(-0.3, 0.3),
        weight_decay_factor=0.01,
        clip_weight_min=-0.8,
        clip_weight_max=0.8,
    ),
}


@pytest.fixture(autouse=True)
def _one_thread() -> Iterator[None]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def multi_hot(
    gen: torch.Generator, vocab: int, samples: int, max_ids: int, combiner: str, weighted: bool
) -> FeatureBatch:
    """Bags of 0..max_ids ids (mean above 2 for max_ids >= 5), duplicates included."""
    lengths = torch.randint(0, max_ids + 1, (samples,), generator=gen)
    offsets = torch.zeros(samples + 1, dtype=torch.int64)
    offsets[1:] = torch.cumsum(lengths, 0)
    values = torch.randint(0, vocab, (int(offsets[-1]),), generator=gen)
    weights = torch.rand(values.numel(), generator=gen) * 2 - 0.5 if weighted else None
    return FeatureBatch(values, offsets, weights, combiner, (samples,))


def step_features(gen: torch.Generator, vocabs: list[int]) -> list[list[FeatureBatch]]:
    """Table 0: two multi-hot features (sum, weighted mean); table 1: sqrtn bags of up to 39
    ids; table 2: bags of at most one id (not listed)."""
    first = [multi_hot(gen, vocabs[0], 24, 9, "sum", False)]
    first.append(multi_hot(gen, vocabs[0], 11, 6, "mean", True))
    return [
        first,
        [multi_hot(gen, vocabs[1], 16, 39, "sqrtn", True)],
        [multi_hot(gen, vocabs[2], 12, 1, "sum", False)],
    ]


def listed(features: list[list[FeatureBatch]], grads: list[list[torch.Tensor]]) -> list[bool]:
    feats, _ = cpu.feature_descriptors("update", features, grads, [])
    per_table = [sum(b.values.numel() for b in fs) for fs in features]
    base = np.concatenate([[0], np.cumsum(per_table)]).astype(np.int64)
    return cpu._listed_tables(cpu.RULES[ec.RowwiseAdagrad], feats, base).tolist()


def grads_for(gen: torch.Generator, features: list[list[FeatureBatch]], dim: int) -> list:
    return [[torch.randn(b.num_samples, dim, generator=gen) for b in fs] for fs in features]


@pytest.mark.parametrize("dim", [13, 128])
@pytest.mark.parametrize("name", sorted(ROWWISE))
@pytest.mark.parametrize("check_finite", [False, True])
def test_listed_tables_match_summed_blocks_to_the_bit_and_the_reference(
    name: str, dim: int, check_finite: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    opt, vocabs = ROWWISE[name], [60, 400, 30]
    states = [make_state(opt, v, dim, seed=t) for t, v in enumerate(vocabs)]
    initial = [copy_state(s) for s in states]
    listed_states = [copy_state(s) for s in states]
    gen = torch.Generator().manual_seed(7)
    steps = [step_features(gen, vocabs) for _ in range(3)]
    for step, features in enumerate(steps, start=1):
        grads = grads_for(gen, features, dim)
        assert listed(features, grads) == [True, True, False]
        lrs = [0.05 * step] * 3
        got = cpu.lookup(listed_states, features)
        want = reference.lookup(states, features)
        for g_acts, w_acts in zip(got, want, strict=True):
            for g, w in zip(g_acts, w_acts, strict=True):
                torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-6)
        assert cpu.update(listed_states, features, grads, lrs, step, check_finite=check_finite)
        with monkeypatch.context() as m:  # every table through the summed-block dedup
            m.setattr(cpu, "_listed_tables", lambda rule, feats, base: np.zeros(3, dtype=bool))
            cpu.update(states, features, grads, lrs, step, check_finite=check_finite)
    for t, (a, b) in enumerate(zip(listed_states, states, strict=True)):
        assert torch.equal(a.weight, b.weight), f"table {t}"
        assert torch.equal(a.slots["accumulators"], b.slots["accumulators"]), f"table {t}"
    # and both agree with the reference backend
    ref = [copy_state(s) for s in initial]
    gen = torch.Generator().manual_seed(7)
    for step, features in enumerate([step_features(gen, vocabs) for _ in range(3)], start=1):
        reference.update(ref, features, grads_for(gen, features, dim), [0.05 * step] * 3, step)
    for t, (got_state, want, before) in enumerate(zip(listed_states, ref, initial, strict=True)):
        assert_states_match(got_state, want, before, ~touched_in_any(steps, t, vocabs[t]))


def _unchanged(states: list[TableState], before: list[TableState]) -> bool:
    slot = "accumulators"
    return all(
        torch.equal(s.weight, b.weight) and torch.equal(s.slots[slot], b.slots[slot])
        for s, b in zip(states, before, strict=True)
    )


def test_non_finite_gradient_of_a_listed_table_changes_no_table() -> None:
    vocabs = [60, 400, 30]
    states = [make_state(ROWWISE["plain"], v, 8, seed=t) for t, v in enumerate(vocabs)]
    before = [copy_state(s) for s in states]
    gen = torch.Generator().manual_seed(3)
    features = step_features(gen, vocabs)
    grads = grads_for(gen, features, 8)
    grads[1][0][5, 2] = float("nan")
    assert listed(features, grads)[1]
    assert not cpu.update(states, features, grads, [0.1] * 3, 1, check_finite=True)
    assert _unchanged(states, before)


def test_out_of_range_id_in_a_listed_table_raises_and_changes_no_table() -> None:
    vocabs = [60, 400, 30]
    states = [make_state(ROWWISE["plain"], v, 8, seed=t) for t, v in enumerate(vocabs)]
    before = [copy_state(s) for s in states]
    gen = torch.Generator().manual_seed(4)
    features = step_features(gen, vocabs)
    features[1][0].values[5] = 400
    grads = grads_for(gen, features, 8)
    assert listed(features, grads)[1]
    with pytest.raises(IndexError, match=r"id 400 .*'table1' with 400 rows"):
        cpu.update(states, features, grads, [0.1] * 3, 1, check_finite=True)
    assert _unchanged(states, before)
    with pytest.raises(IndexError, match=r"id 400 .*'table1' with 400 rows"):
        cpu.lookup(states, features)
