"""Pipelined execution (docs/semantics.md §4.5), prepared batches and the statistics hook of the
engine."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import numpy as np
import pytest
import torch

import embcore as ec
from embcore.stats import TableStats

VOCAB, DIM, LR = 6, 3, 0.1
BATCHES = [[1, 2], [2, 3], [3, 2], [0, 2]]  # consecutive steps share ids


def init_rows(shape, dtype=torch.float32):
    return torch.arange(shape[0] * shape[1], dtype=dtype).reshape(shape) / 10


def make_engine(pipelined: bool) -> ec.EmbeddingEngine:
    table = ec.TableConfig(vocabulary_size=VOCAB, dim=DIM, name="t", initializer=init_rows)
    return ec.EmbeddingEngine(
        {"f": ec.FeatureConfig(table=table)},
        optimizer=ec.Adagrad(learning_rate=LR),
        pipeline_execution_with_tensor_core=pipelined,
    )


def numpy_reference(pipelined: bool):
    """Adagrad on loss = sum(act^2); pipelined lookups miss the previous step's update."""
    w = (np.arange(VOCAB * DIM, dtype=np.float64).reshape(VOCAB, DIM) / 10).astype(np.float32)
    w = w.astype(np.float64)
    acc = np.full_like(w, 0.1)
    acts, deferred = [], None
    for ids in BATCHES:
        act = w[ids].copy()
        if deferred is not None:  # step N-1's update lands after step N's lookup
            deferred()
            deferred = None
        acts.append(act)
        grad = np.zeros_like(w)
        np.add.at(grad, ids, 2 * act)
        rows = np.unique(ids)

        def update(rows=rows, grad=grad):
            acc[rows] += grad[rows] ** 2
            w[rows] -= LR * grad[rows] / np.sqrt(acc[rows])

        if pipelined:
            deferred = update
        else:
            update()
    if deferred is not None:
        deferred()
    return acts, w, acc


@pytest.mark.parametrize("pipelined", [False, True])
@pytest.mark.parametrize("style", ["enqueue", "forward"])
def test_staleness_against_numpy(pipelined, style):
    emb = make_engine(pipelined)
    got = []
    for ids in BATCHES:
        batch = {"f": torch.tensor(ids)}
        if style == "enqueue":
            emb.enqueue(batch)
            act = emb.dequeue()["f"]
            emb.apply_gradients({"f": 2 * act.detach()})
        else:
            act = emb(batch)["f"]
            (act**2).sum().backward()
        got.append(act.detach().numpy())
    want_acts, want_w, want_acc = numpy_reference(pipelined)
    for g, w in zip(got, want_acts, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-7)
    assert emb.step == (len(BATCHES) - 1 if pipelined else len(BATCHES))
    sd = emb.state_dict()  # drains the pipeline
    assert emb.step == len(BATCHES)
    np.testing.assert_allclose(sd["t.weight"].numpy(), want_w, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(sd["t.accumulators"].numpy(), want_acc, rtol=1e-6)


def test_pipelining_changes_results_only_when_ids_repeat():
    a, b = make_engine(False), make_engine(True)
    assert not np.allclose(numpy_reference(False)[1], numpy_reference(True)[1])
    for ids in ([0], [1], [2]):  # no id repeats across steps: identical
        for emb in (a, b):
            act = emb({"f": torch.tensor(ids)})["f"]
            (act**2).sum().backward()
    b.flush()
    assert torch.equal(a.embedding_tables["t"], b.embedding_tables["t"])


def test_pipeline_alias_and_conflict():
    table = ec.TableConfig(vocabulary_size=4, dim=2)
    feats = {"f": ec.FeatureConfig(table=table)}
    assert ec.EmbeddingEngine(feats, pipeline=True).pipelined
    assert not ec.EmbeddingEngine(feats).pipelined
    with pytest.raises(ValueError, match="disagree"):
        ec.EmbeddingEngine(feats, pipeline=False, pipeline_execution_with_tensor_core=True)


def test_one_pipelining_flag_under_both_names():
    """``pipeline`` is the flag, ``pipeline_execution_with_tensor_core`` TF's name for it."""
    table = ec.TableConfig(vocabulary_size=4, dim=2)
    feats = {"f": ec.FeatureConfig(table=table)}
    assert ec.EmbeddingEngine(feats, pipeline_execution_with_tensor_core=True).pipelined
    assert not ec.EmbeddingEngine(feats, pipeline_execution_with_tensor_core=False).pipelined
    assert ec.EmbeddingEngine(
        feats, pipeline=True, pipeline_execution_with_tensor_core=True
    ).pipelined
    with pytest.raises(ValueError, match=r"pipeline=True and pipeline_execution_with_tensor_core="):
        ec.EmbeddingEngine(feats, pipeline=True, pipeline_execution_with_tensor_core=False)


def test_load_state_dict_drops_a_deferred_update():
    emb = make_engine(True)
    start = {k: v.clone() for k, v in emb.state_dict().items()}
    act = emb({"f": torch.tensor([1])})["f"]
    (act**2).sum().backward()
    emb.load_state_dict(start)
    emb.flush()
    assert torch.equal(emb.embedding_tables["t"], start["t.weight"])


def test_prepared_batches_from_a_thread_match_direct_input():
    a, b = make_engine(False), make_engine(False)
    prepared = []
    thread = threading.Thread(
        target=lambda: prepared.extend(a.prepare({"f": torch.tensor(ids)}) for ids in BATCHES)
    )
    thread.start()
    thread.join()
    for ids, p in zip(BATCHES, prepared, strict=True):
        (a(p)["f"] ** 2).sum().backward()
        (b({"f": torch.tensor(ids)})["f"] ** 2).sum().backward()
    assert torch.equal(a.embedding_tables["t"], b.embedding_tables["t"])
    with pytest.raises(ValueError, match="prepared by another engine"):
        b(prepared[0])
    with pytest.raises(ValueError, match="pass weights to prepare"):
        a.enqueue(prepared[0], weights={"f": None})


def test_statistics_hook_writes_files_and_never_changes_numerics(tmp_path):
    table = ec.TableConfig(vocabulary_size=VOCAB, dim=DIM, name="t", initializer=init_rows)
    feats = {"f": ec.FeatureConfig(table=table), "g": ec.FeatureConfig(table=table)}
    plain = ec.EmbeddingEngine(feats, optimizer=ec.SGD(learning_rate=0.1))
    profiled = ec.EmbeddingEngine(
        feats,
        optimizer=ec.SGD(learning_rate=0.1),
        profile_data_directory=str(tmp_path),
        profile_sample_rate=1.0,
    )
    for ids in BATCHES:
        for emb in (plain, profiled):
            acts = emb({"f": torch.tensor(ids), "g": torch.tensor(ids[::-1])})
            (acts["f"].sum() + acts["g"].sum()).backward()
    assert torch.equal(plain.embedding_tables["t"], profiled.embedding_tables["t"])
    (path,) = profiled.write_statistics()

    stats = TableStats.from_json(json.loads(Path(path).read_text()))
    assert (stats.batches, stats.examples, stats.ids) == (4, 8, 16)
    assert stats.mean_ids_per_example == 2.0  # one id from each of the two features
    assert stats.hottest(1) == [(2, 8)]
    with pytest.raises(RuntimeError, match="no profile_data_directory"):
        plain.write_statistics()


def test_pipelined_update_runs_in_the_background_and_reraises(monkeypatch):
    """On the CPU, step N's update runs on the engine's update thread while the caller works
    on step N+1's activations; an error there surfaces at the next join, tables unchanged."""
    import embcore.engine as engine_module

    emb = make_engine(True)
    real_update, threads = engine_module.ops.update, []

    def spy(*args, **kwargs):
        threads.append(threading.current_thread().name)
        return real_update(*args, **kwargs)

    monkeypatch.setattr(engine_module.ops, "update", spy)
    for ids in BATCHES:
        (emb({"f": torch.tensor(ids)})["f"] ** 2).sum().backward()
    emb.flush()  # the last update: applied here, on the caller's thread
    assert len(threads) == len(BATCHES)
    assert all(name.startswith("embcore-update") for name in threads[:-1])
    assert not threads[-1].startswith("embcore-update")
    np.testing.assert_allclose(
        emb.embedding_tables["t"].numpy(), numpy_reference(True)[1], rtol=1e-6, atol=1e-7
    )

    def boom(*args, **kwargs):
        raise RuntimeError("kernel failed")

    before = emb.embedding_tables["t"].clone()
    monkeypatch.setattr(engine_module.ops, "update", boom)
    (emb({"f": torch.tensor([1])})["f"] ** 2).sum().backward()
    emb({"f": torch.tensor([2])})  # submits the failing update
    with pytest.raises(RuntimeError, match="kernel failed"):
        emb.flush()
    assert torch.equal(emb.embedding_tables["t"], before)
