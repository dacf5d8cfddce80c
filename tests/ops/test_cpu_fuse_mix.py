"""One step of the fused CPU backend over tables on both sides of its fuse threshold.

When every table has the same lazy optimizer with a ``fused`` rule (Adagrad, row-wise
Adagrad), a table whose summed gradients fit in ``FUSE_BYTES`` gets its rule right after its
own dedup, and the others get it in the separate per-row pass. A step mixing both kinds must
update every table: checked through the engine against the independent NumPy model, with a
third table on the hashed-dedup side of its other threshold (few ids for a big vocabulary).
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import numpy_reference as ref
import pytest
import torch
from engine_cases import initializer_from, ragged_input, ragged_samples, table_values

import embcore as ec
from embcore.ops.cpu import FUSE_BYTES

#: ``(vocab, dim, ids per step)``: "big" sums 8224 * 64 floats (> FUSE_BYTES, not fused),
#: "small" and "sparse" are fused; "sparse" has few ids for its vocabulary (hashed dedup)
TABLES = {"big": (3000, 64, 8224), "small": (40, 5, 30), "sparse": (50_000, 3, 12)}


@pytest.fixture(autouse=True)
def _one_thread() -> Iterator[None]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _rows(rng: np.random.Generator, vocab: int, ids: int) -> list[ref.Sample]:
    """``ids`` weighted ids in bags of 1-3, duplicates included."""
    out: list[ref.Sample] = []
    while ids > 0:
        n = min(ids, int(rng.integers(1, 4)))
        out.append(
            [(int(rng.integers(vocab)), float(np.float32(rng.uniform(0.5, 2)))) for _ in range(n)]
        )
        ids -= n
    return out


@pytest.mark.parametrize(
    ("kind", "optimizer", "hp"),
    [
        ("adagrad", ec.Adagrad(learning_rate=0.2), {}),
        ("rowwise_adagrad", ec.RowwiseAdagrad(learning_rate=0.2), {}),
    ],
)
def test_fused_and_unfused_tables_are_all_updated_in_one_step(kind, optimizer, hp) -> None:
    assert 4 * TABLES["big"][1] * TABLES["big"][2] > FUSE_BYTES
    assert 4 * TABLES["small"][1] * TABLES["small"][2] <= FUSE_BYTES
    rng = np.random.default_rng(3)
    values = {n: table_values(rng, v, d) for n, (v, d, _) in TABLES.items()}
    features = {
        n: ec.FeatureConfig(
            ec.TableConfig(v, d, initializer=initializer_from(values[n]), combiner="mean", name=n)
        )
        for n, (v, d, _) in TABLES.items()
    }
    engine = ec.EmbeddingEngine(features, optimizer, backend="cpu")
    tables = {n: values[n].astype(np.float64) for n in TABLES}
    slots = {n: ref.initial_slots(kind, hp, v, d) for n, (v, d, _) in TABLES.items()}
    for step in range(1, 3):
        rows = {n: _rows(rng, v, k) for n, (v, _, k) in TABLES.items()}
        batch, weights = {}, {}
        for n in TABLES:
            batch[n], weights[n] = ragged_input(rows[n])
        acts = engine(batch, weights=weights)
        loss = 0.0
        grads = {}
        for n, (vocab, dim, _) in TABLES.items():
            samples = ragged_samples(rows[n])
            want = ref.lookup(tables[n], samples, "mean")
            np.testing.assert_allclose(acts[n].detach().numpy(), want, rtol=1e-5, atol=1e-6)
            grads[n] = rng.standard_normal((len(samples), dim)).astype(np.float32)
            loss = loss + (acts[n] * torch.from_numpy(grads[n])).sum()
            g, touched = ref.row_gradients(vocab, dim, [(samples, "mean", grads[n])])
            ref.apply_update(kind, hp, tables[n], slots[n], g, touched, 0.2, step)
        loss.backward()
        for n in TABLES:
            got = engine.embedding_tables[n].numpy()
            np.testing.assert_allclose(got, tables[n], rtol=1e-5, atol=1e-6, err_msg=n)
            for slot, value in slots[n].items():
                got_slot = engine.slot_variables[n][slot].numpy()
                np.testing.assert_allclose(got_slot, value, rtol=1e-5, atol=1e-6, err_msg=n)


@pytest.mark.parametrize("vocab", [7, 300, 60_000])  # the table's index; hashed dedup (both)
def test_non_lazy_adam_updates_the_touched_rows_whichever_dedup_ran(vocab: int) -> None:
    """Non-lazy Adam sweeps every row and finds a touched row's gradient through the table's
    index; with few ids for the vocabulary the dedup is hashed and must still leave it."""
    hp = {"learning_rate": 0.05, "lazy_adam": False, "weight_decay_factor": 0.1}
    rng = np.random.default_rng(vocab)
    values = table_values(rng, vocab, 2)
    table = ec.TableConfig(vocab, 2, initializer=initializer_from(values), name="t")
    engine = ec.EmbeddingEngine(ec.FeatureConfig(table), ec.Adam(**hp), backend="cpu")
    want = values.astype(np.float64)
    slots = ref.initial_slots("adam", hp, vocab, 2)
    for step in range(1, 4):
        ids = rng.integers(vocab, size=6)
        acts = engine(torch.from_numpy(ids))
        grad = rng.standard_normal((6, 2)).astype(np.float32)
        (acts * torch.from_numpy(grad)).sum().backward()
        samples = [[(int(i), 1.0)] for i in ids]
        g, touched = ref.row_gradients(vocab, 2, [(samples, "sum", grad)])
        ref.apply_update("adam", hp, want, slots, g, touched, 0.05, step)
        got = engine.embedding_tables["t"].numpy()
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6, err_msg=f"step {step}")
