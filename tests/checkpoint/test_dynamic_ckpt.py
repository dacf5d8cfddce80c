"""``ec.checkpoint`` with dynamic tables: full saves, deltas (``base=``) and their chains,
loads whatever order the records were written in, and clear refusals. Every loaded state is
compared with the live engine's at the moment of the save, and training resumed from a load
with training never interrupted, bit for bit."""

from __future__ import annotations

import itertools
import json
import os
import shutil

import numpy as np
import pytest
import torch
from dynamic_ckpt_cases import assert_same, dir_bytes, make_engine, snapshot, train_step

import embcore as ec
from embcore.checkpoint import CheckpointError, _delta, _dynamic


@pytest.mark.parametrize(("pipeline", "disk"), [(False, False), (True, False), (True, True)])
def test_save_load_then_train_equals_training_without_interruption(tmp_path, pipeline, disk):
    """``disk``: the dynamic tables in DiskStorage, with caches of a few rows, on both sides."""
    rows = (lambda name: tmp_path / name) if disk else (lambda name: None)
    engine = make_engine(pipeline, rows=rows("rows"))
    for step in range(7):
        train_step(engine, step)
    ec.checkpoint.save(engine, tmp_path / "c")
    saved = snapshot(engine)
    assert saved["user:pending/keys"].numel() > 0  # some keys were waiting for admission
    resumed = make_engine(pipeline, rows=rows("resumed"))
    ec.checkpoint.load(resumed, tmp_path / "c")
    assert_same(snapshot(resumed), saved)
    for step in range(7, 12):
        train_step(engine, step)
        train_step(resumed, step)
    assert_same(snapshot(resumed), snapshot(engine))
    manifest = ec.checkpoint.verify(tmp_path / "c")
    user = manifest["dynamic"]["user"]["groups"]
    assert user["rows"]["count"] == saved["user:keys"].numel()
    assert user["pending"]["count"] == saved["user:pending/keys"].numel()
    assert "base" not in manifest
    (table,) = [t for t in manifest["tables"] if t["name"] == "user"]
    assert table["vocabulary_size"] is None and table["admission"] == {"min_count": 2}
    assert table["eviction"] == {"steps_to_live": 3, "max_rows": 20}


@pytest.mark.parametrize("disk", [False, True])
def test_a_lookup_only_engine_loads_the_rows_without_their_slots(tmp_path, disk):
    """``disk``: the serving engine's dynamic tables in DiskStorage (caches of a few rows)."""
    engine = make_engine()
    for step in range(5):
        train_step(engine, step)
    ec.checkpoint.save(engine, tmp_path / "c")
    serving = make_engine(lookup_only=True, rows=tmp_path / "rows" if disk else None)
    ec.checkpoint.load(serving, tmp_path / "c")
    want = snapshot(engine)
    slots = ("accumulators", "momenta", "velocities")
    assert_same(snapshot(serving), {k: v for k, v in want.items() if not k.endswith(slots)})
    for table in ("user", "item"):
        keys = engine.table_keys(table)
        assert torch.equal(serving.table_rows(table, keys), engine.table_rows(table, keys))


def test_another_optimizer_is_refused_unless_allowed_then_slots_start_fresh(tmp_path):
    engine = make_engine()
    for step in range(5):
        train_step(engine, step)
    ec.checkpoint.save(engine, tmp_path / "c")
    want = snapshot(engine)
    other = make_engine(
        item_optimizer=ec.Adagrad(learning_rate=0.1, initial_accumulator_value=0.25)
    )
    before = snapshot(other)
    with pytest.raises(
        CheckpointError,
        match=r"table 'item': optimizer Adam in the checkpoint, Adagrad in the engine \(pass "
        r"allow_optimizer_change=True",
    ):
        ec.checkpoint.load(other, tmp_path / "c")
    assert_same(snapshot(other), before)
    ec.checkpoint.load(other, tmp_path / "c", allow_optimizer_change=True)
    got = snapshot(other)
    n = want["item:keys"].numel()
    fresh = {"item:accumulators": torch.full((n, 3), 0.25)}
    kept = {k: v for k, v in want.items() if k not in ("item:momenta", "item:velocities")}
    assert_same(got, kept | fresh)


def chain_of_deltas(tmp_path, steps: int = 12, every: int = 3):
    """Train ``steps`` steps; after every ``every``: a full save ``full-N`` and a delta
    ``delta-N`` on the previous delta (the first is full). Returns the snapshots by step."""
    engine = make_engine()
    snaps, base = {}, None
    for step in range(steps):
        train_step(engine, step)
        if (step + 1) % every == 0:
            n = step + 1
            ec.checkpoint.save(engine, tmp_path / f"full-{n}")
            ec.checkpoint.save(engine, tmp_path / f"delta-{n}", base=base)
            snaps[n] = snapshot(engine)
            base = tmp_path / f"delta-{n}"
    return engine, snaps


def test_a_chain_of_three_deltas_loads_exactly_what_full_saves_hold(tmp_path):
    _, snaps = chain_of_deltas(tmp_path)
    for n, want in snaps.items():
        for name in (f"full-{n}", f"delta-{n}"):
            fresh = make_engine()
            ec.checkpoint.load(fresh, tmp_path / name)
            assert_same(snapshot(fresh), want)
    manifests = [ec.checkpoint.verify(tmp_path / f"delta-{n}") for n in snaps]
    assert "base" not in manifests[0]
    assert [m["base"]["name"] for m in manifests[1:]] == ["delta-3", "delta-6", "delta-9"]
    # inserts, updates and evictions all happened along the chain, and were stored as such
    rows = [m["dynamic"]["user"]["groups"]["rows"] for m in manifests[1:]]
    assert all(r["stored"] > 0 for r in rows) and sum(r["deleted"] for r in rows) > 0
    keys = [set(snaps[n]["user:keys"].tolist()) for n in snaps]
    assert any(b - a for a, b in itertools.pairwise(keys))  # inserted
    assert any(a - b for a, b in itertools.pairwise(keys))  # evicted


def test_a_delta_after_a_restart_reads_its_base_from_disk(tmp_path):
    engine, _ = chain_of_deltas(tmp_path, steps=6)
    # a new process: nothing remembered; it resumes from the full save of step 6
    resumed = make_engine()
    ec.checkpoint.load(resumed, tmp_path / "full-6")
    _delta._KNOWN.clear()
    for step in range(6, 8):
        train_step(engine, step)
        train_step(resumed, step)
    ec.checkpoint.save(engine, tmp_path / "a", base=tmp_path / "delta-6")  # remembered base
    ec.checkpoint.save(resumed, tmp_path / "b", base=tmp_path / "delta-6")  # read from disk
    ma, mb = (
        ec.checkpoint.read_manifest(tmp_path / "a"),
        ec.checkpoint.read_manifest(tmp_path / "b"),
    )
    assert ma["dynamic"] == mb["dynamic"] and ma["base"] == mb["base"]
    fresh = make_engine()
    ec.checkpoint.load(fresh, tmp_path / "b")
    assert_same(snapshot(fresh), snapshot(engine))


@pytest.mark.parametrize("disk", [False, True])
def test_a_delta_is_proportional_to_the_rows_touched(tmp_path, disk):
    """``disk``: the table in DiskStorage (a cache of 100 rows): its deltas are the same."""
    storage = ec.DiskStorage(tmp_path / "rows", 100 * (4 * 32 + 40)) if disk else None
    table = ec.TableConfig(vocabulary_size=None, dim=16, name="user", storage=storage)
    engine = ec.EmbeddingEngine({"u": ec.FeatureConfig(table=table)}, ec.Adagrad(0.1), seed=1)
    keys = torch.arange(40_000, dtype=torch.int64) * 7919 - 10**12

    def step(ids: torch.Tensor) -> None:
        engine({"u": ids})["u"].sum().backward()

    step(keys)
    ec.checkpoint.save(engine, tmp_path / "full")
    sizes = {}
    for touched in (10, 1000):
        ids = torch.cat([keys[: touched // 2], 10**15 + torch.arange(touched - touched // 2)])
        step(ids)
        ec.checkpoint.save(engine, tmp_path / f"d{touched}", base=tmp_path / "full")
        rows = ec.checkpoint.read_manifest(tmp_path / f"d{touched}")["dynamic"]["user"]
        # each delta holds its own step's keys and those of the steps since the full save
        assert rows["groups"]["rows"]["deleted"] == 0
        sizes[touched] = dir_bytes(tmp_path / f"d{touched}")
    stored = {
        n: ec.checkpoint.read_manifest(tmp_path / f"d{n}")["dynamic"]["user"]["groups"]["rows"]
        for n in sizes
    }
    assert stored[10]["stored"] == 10
    assert stored[1000]["stored"] == 1000  # keys[:500] and 500 new keys, all since the base
    full = dir_bytes(tmp_path / "full")
    assert sizes[10] * 50 < full
    # a record: key, freq, last_seen (8 bytes each), weight and accumulators (16 float32 each)
    # and its digest (16 bytes)
    per_record = 3 * 8 + 2 * 16 * 4 + 16
    grown = sizes[1000] - sizes[10]
    want = (stored[1000]["stored"] - stored[10]["stored"]) * per_record
    assert abs(grown - want) < 0.05 * want, (grown, want)


def test_records_written_in_any_order_load_the_same(tmp_path, monkeypatch):
    """Several ranks write their keys in hash order, not globally sorted: a reader sorts."""
    engine = make_engine()
    for step in range(6):
        train_step(engine, step)
    split = _dynamic.split

    def scrambled(table, state):
        groups, extras = split(table, state)
        for group, records in groups.items():
            order = np.argsort((records.keys * 0x5851F42D4C957F2D) % 1013, kind="stable")
            groups[group] = records.take(order)
        return groups, extras

    monkeypatch.setattr(_dynamic, "split", scrambled)
    ec.checkpoint.save(engine, tmp_path / "c")
    monkeypatch.undo()
    fresh = make_engine()
    ec.checkpoint.load(fresh, tmp_path / "c")
    assert_same(snapshot(fresh), snapshot(engine))


# ------------------------------------------------------------------------ refusals
def flip_a_byte(path, key: str) -> None:
    manifest = ec.checkpoint.read_manifest(path)
    (chunk,) = manifest["tensors"][key]["chunks"]
    with open(os.path.join(path, chunk["file"]), "r+b") as f:
        f.seek(chunk["offset"] + chunk["length"] - 3)
        byte = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([byte[0] ^ 0x10]))


def test_verify_and_load_refuse_a_delta_whose_base_is_corrupt_missing_or_replaced(tmp_path):
    chain_of_deltas(tmp_path, steps=9)
    fresh = make_engine()
    before = snapshot(fresh)
    flip_a_byte(tmp_path / "delta-3", "user.weight")
    for check in (ec.checkpoint.verify, lambda p: ec.checkpoint.load(fresh, p)):
        with pytest.raises(CheckpointError, match=r"delta-3 is corrupt.*'user\.weight'.*base of"):
            check(tmp_path / "delta-9")
    assert_same(snapshot(fresh), before)

    shutil.rmtree(tmp_path / "delta-6")
    for check in (ec.checkpoint.verify, lambda p: ec.checkpoint.load(fresh, p)):
        with pytest.raises(FileNotFoundError, match=r"the base .*delta-6 of the delta .*delta-9"):
            check(tmp_path / "delta-9")
    # a checkpoint saved anew under the base's name is not the base
    shutil.copytree(tmp_path / "full-6", tmp_path / "delta-6")
    with pytest.raises(CheckpointError, match=r"delta-6 is not the base .*delta-9 was saved"):
        ec.checkpoint.load(fresh, tmp_path / "delta-9")
    assert_same(snapshot(fresh), before)


def edit_manifest(path, change) -> None:
    manifest_path = os.path.join(path, "embcore_manifest.json")
    with open(manifest_path) as f:
        document = json.load(f)
    change(document)
    with open(manifest_path, "w") as f:
        json.dump(document, f)


def test_a_crafted_delta_is_refused_before_anything_is_read_or_changed(tmp_path):
    chain_of_deltas(tmp_path, steps=6)
    os.symlink(tmp_path / "delta-3", tmp_path / "link")
    fresh = make_engine()
    before = snapshot(fresh)
    pristine = (tmp_path / "delta-6" / "embcore_manifest.json").read_bytes()
    cases = [
        (lambda m: m["base"].update(name="../x/delta-3"), r"names its base '\.\./x/delta-3'"),
        (lambda m: m["base"].update(name="link"), r"link, the base of .*delta-6, is a symbolic"),
        (lambda m: m["base"].update(manifest_sha256="0" * 64), r"delta-3 is not the base"),
        (
            lambda m: m["dynamic"]["user"]["groups"]["rows"].update(count=1),
            r"delta-6: table 'user': replaying its chain gave \d+ rows records",
        ),
        (lambda m: m["base"].update(name=None), r"delta-6: the manifest is malformed"),
        (lambda m: m["dynamic"].update(user=3), r"delta-6: table 'user': the manifest's \"dy"),
    ]
    for change, message in cases:
        (tmp_path / "delta-6" / "embcore_manifest.json").write_bytes(pristine)
        edit_manifest(tmp_path / "delta-6", change)
        for check in (ec.checkpoint.verify, lambda p: ec.checkpoint.load(fresh, p)):
            with pytest.raises(CheckpointError, match=message):
                check(tmp_path / "delta-6")
        assert_same(snapshot(fresh), before)


def test_save_refuses_a_base_that_does_not_fit_and_writes_nothing(tmp_path):
    engine = make_engine()
    train_step(engine, 0)
    other = make_engine(dim=5)
    train_step(other, 0)
    ec.checkpoint.save(other, tmp_path / "other")
    fixed = ec.EmbeddingEngine(
        {"x": ec.FeatureConfig(table=ec.TableConfig(vocabulary_size=3, dim=2, name="user"))}
    )
    ec.checkpoint.save(fixed, tmp_path / "fixed")
    before = snapshot(engine)
    cases = [
        (
            tmp_path / "other",
            CheckpointError,
            r"base .*other was saved by an engine that does not "
            r"fit this one: table 'user': dim 5 in the base, 4 here",
        ),
        (tmp_path / "fixed", CheckpointError, r"table 'user': vocabulary_size 3 in the base, None"),
        (tmp_path / "missing", FileNotFoundError, r"no checkpoint at .*missing"),
        (tmp_path / "new", ValueError, r"base=.*new.* must be another checkpoint in the directory"),
        (tmp_path / "elsewhere" / "c", ValueError, r"must be another checkpoint in the directory"),
    ]
    for base, error, message in cases:
        with pytest.raises(error, match=message):
            ec.checkpoint.save(engine, tmp_path / "new", base=base)
        assert sorted(os.listdir(tmp_path)) == ["fixed", "other"]
    assert_same(snapshot(engine), before)


def test_an_engine_without_dynamic_tables_writes_full_checkpoints_even_with_a_base(tmp_path):
    table = ec.TableConfig(vocabulary_size=5, dim=2, name="f")
    engine = ec.EmbeddingEngine({"x": ec.FeatureConfig(table=table)}, ec.Adagrad(0.1))
    engine({"x": torch.tensor([1, 3])})["x"].sum().backward()
    ec.checkpoint.save(engine, tmp_path / "a")
    engine({"x": torch.tensor([2])})["x"].sum().backward()
    ec.checkpoint.save(engine, tmp_path / "b", base=tmp_path / "a")
    assert "base" not in ec.checkpoint.read_manifest(tmp_path / "b")
    shutil.rmtree(tmp_path / "a")
    fresh = ec.EmbeddingEngine({"x": ec.FeatureConfig(table=table)}, ec.Adagrad(0.1))
    ec.checkpoint.load(fresh, tmp_path / "b")
    for key, value in engine.state_dict().items():
        assert torch.equal(fresh.state_dict()[key], value), key


def test_load_refuses_a_table_dynamic_on_one_side_only(tmp_path):
    engine = make_engine()
    train_step(engine, 0)
    ec.checkpoint.save(engine, tmp_path / "dyn")
    fixed = ec.EmbeddingEngine(
        {"x": ec.FeatureConfig(table=ec.TableConfig(vocabulary_size=3, dim=4, name="user"))}
    )
    before = {k: v.clone() for k, v in fixed.state_dict().items()}
    with pytest.raises(
        CheckpointError, match="table 'user' is dynamic in the checkpoint, fixed in the engine"
    ):
        ec.checkpoint.load(fixed, tmp_path / "dyn")
    for k, v in fixed.state_dict().items():
        assert torch.equal(v, before[k])
    ec.checkpoint.save(fixed, tmp_path / "fixed")
    fresh = make_engine()
    want = snapshot(fresh)
    with pytest.raises(
        CheckpointError, match="table 'user' is dynamic in the engine, fixed in the checkpoint"
    ):
        ec.checkpoint.load(fresh, tmp_path / "fixed")
    assert_same(snapshot(fresh), want)
