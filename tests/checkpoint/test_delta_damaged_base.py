"""A delta saved on a damaged base must fail at save time, naming the damage, and write
nothing: a delta that was published could never load. Every kind of damage a chain can have
(a corrupt chunk in the base or further back, a base whose own base is missing or was
replaced, an edited manifest), with the base read from disk (a new process) and with the base
the engine remembers (it saved that very checkpoint)."""

from __future__ import annotations

import json
import os
import shutil

import pytest
from dynamic_ckpt_cases import assert_same, make_engine, snapshot, train_step
from test_dynamic_ckpt import chain_of_deltas, flip_a_byte

import embcore as ec
from embcore.checkpoint import CheckpointError


def _edit_counts(path) -> None:
    manifest_path = os.path.join(path, "embcore_manifest.json")
    with open(manifest_path) as f:
        document = json.load(f)
    document["dynamic"]["user"]["groups"]["rows"]["count"] += 1
    with open(manifest_path, "w") as f:
        json.dump(document, f)


#: ``(what is damaged, how, the error, its message)``; the chain is delta-3 (full) <- delta-6
DAMAGES = {
    "base-weight-chunk": (
        lambda tmp: flip_a_byte(tmp / "delta-6", "user.weight"),
        CheckpointError,
        r"delta-6 is corrupt.*'user\.weight'",
    ),
    "root-weight-chunk": (
        lambda tmp: flip_a_byte(tmp / "delta-3", "user.weight"),
        CheckpointError,
        r"delta-3 is corrupt.*'user\.weight'",
    ),
    "root-keys-chunk": (
        lambda tmp: flip_a_byte(tmp / "delta-3", "item.keys"),
        CheckpointError,
        r"delta-3 is corrupt.*'item\.keys'",
    ),
    "root-missing": (
        lambda tmp: shutil.rmtree(tmp / "delta-3"),
        FileNotFoundError,
        r"the base .*delta-3 of the delta .*delta-6",
    ),
    "root-replaced": (
        lambda tmp: (
            shutil.rmtree(tmp / "delta-3"),
            shutil.copytree(tmp / "full-6", tmp / "delta-3"),
        ),
        CheckpointError,
        r"delta-3 is not the base .*delta-6 was saved",
    ),
    "base-manifest-edited": (
        lambda tmp: _edit_counts(tmp / "delta-6"),
        CheckpointError,
        r"delta-6: table 'user': replaying its chain gave",
    ),
}


@pytest.fixture(scope="module")
def chain(tmp_path_factory) -> tuple:
    """A pristine chain (delta-3 full, delta-6 on it, full-3 and full-6 beside), the engine
    that saved it and trained one more step (it remembers delta-6), and an engine that
    loaded full-6 and trained the same step (it reads delta-6 from disk)."""
    tmp = tmp_path_factory.mktemp("chain")
    engine, _ = chain_of_deltas(tmp, steps=6)
    restarted = make_engine()
    ec.checkpoint.load(restarted, tmp / "full-6")
    for e in (engine, restarted):
        train_step(e, 6)
    assert_same(snapshot(restarted), snapshot(engine))
    return tmp, {"remembered": engine, "from-disk": restarted}


@pytest.mark.parametrize("mode", ["remembered", "from-disk"])
def test_a_delta_on_a_damaged_base_fails_at_save_and_writes_nothing(tmp_path, chain, mode):
    pristine, engines = chain
    engine = engines[mode]
    before = snapshot(engine)
    for damage, (damage_it, error, message) in DAMAGES.items():
        case = tmp_path / damage
        shutil.copytree(pristine, case)
        damage_it(case)
        listing = sorted(os.listdir(case))
        with pytest.raises(error, match=message):
            ec.checkpoint.save(engine, case / "new", base=case / "delta-6")
        assert sorted(os.listdir(case)) == listing, damage
        assert_same(snapshot(engine), before)
    # the control: on the pristine chain the same save succeeds and the delta loads
    case = tmp_path / "intact"
    shutil.copytree(pristine, case)
    ec.checkpoint.save(engine, case / "new", base=case / "delta-6")
    fresh = make_engine()
    ec.checkpoint.load(fresh, case / "new")
    assert_same(snapshot(fresh), before)
