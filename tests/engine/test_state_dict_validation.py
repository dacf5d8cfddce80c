"""``load_state_dict`` checks every table, fixed and dynamic, before its first copy: a state
dict with one bad entry (a malformed or impossible dynamic-table state, a fixed table of
the wrong dtype, a negative step) raises naming the table and the entry and loads nothing,
with ``strict`` or without; with ``strict=True`` a dynamic table's pending-admission
entries are required. Checkpoints holding an impossible dynamic table are refused the same
way."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
import torch

import embcore as ec
from embcore.sharding import ShardingPlan, TableShard

SEEN = "seen"


def make_engine(plan: str | None = None, admission: int = 2) -> ec.EmbeddingEngine:
    video = ec.TableConfig(vocabulary_size=10, dim=4, name="video")
    seen = ec.TableConfig(
        None, 3, name=SEEN, combiner="sum", admission=ec.CountAdmission(min_count=admission)
    )
    features = {"watched": ec.FeatureConfig(table=video), "clicked": ec.FeatureConfig(table=seen)}
    sharded = None
    if plan == "key_hash":
        sharded = ShardingPlan(
            world_size=1,
            tables={
                "video": TableShard.row_wise([0]),
                SEEN: TableShard(scheme="key_hash", ranks=(0,)),
            },
        )
    return ec.EmbeddingEngine(features, optimizer=ec.Adagrad(learning_rate=0.1), plan=sharded)


def trained_state(plan: str | None = None) -> dict[str, torch.Tensor]:
    """A state dict with keys held (5, 7, 9) and pending (11, 13), at step 2."""
    emb = make_engine(plan)
    for clicked in ([5, 5, 7, 11], [7, 9, 9, 13]):
        acts = emb({"watched": torch.tensor([1, 2]), "clicked": torch.tensor(clicked)})
        sum(a.sum() for a in acts.values()).backward()
    state = {k: v.detach().clone() for k, v in emb.state_dict().items()}
    assert state[f"{SEEN}.keys"].tolist() == [5, 7, 9]
    assert state[f"{SEEN}.pending/keys"].tolist() == [11, 13]
    return state


def snapshot(emb: ec.EmbeddingEngine) -> dict[str, np.ndarray]:
    return {k: v.detach().clone().numpy() for k, v in emb.state_dict().items()}


def assert_same(before: dict[str, np.ndarray], after: dict[str, np.ndarray]) -> None:
    assert before.keys() == after.keys()
    for key, value in before.items():
        np.testing.assert_array_equal(after[key], value, err_msg=key)


def fresh_fixed(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``state`` with new values in the fixed table (so a half-applied load shows)."""
    out = dict(state)
    out["video.weight"] = torch.full((10, 4), 0.25)
    out["video.accumulators"] = torch.full((10, 4), 3.0)
    out["step"] = torch.tensor(40)
    return out


def _set(key: str, value: Callable[[dict], torch.Tensor]) -> Callable[[dict], None]:
    def edit(s: dict) -> None:
        s[f"{SEEN}.{key}"] = value(s)

    return edit


def _get(s: dict, key: str) -> torch.Tensor:
    return s[f"{SEEN}.{key}"]


# (name, edit, message): each edit breaks the dynamic table's state one way
BROKEN = [
    ("keys int32", _set("keys", lambda s: _get(s, "keys").int()), r"'keys' must be \(N,\) int64"),
    (
        "duplicate key",
        _set("keys", lambda s: torch.tensor([5, 7, 7])),
        r"'keys' holds key 7 twice",
    ),
    (
        "keys not ascending",
        _set("keys", lambda s: torch.tensor([9, 5, 7])),
        r"'keys' is not ascending \(9 before 5\)",
    ),
    (
        "freq of 2 entries",
        _set("freq", lambda s: _get(s, "freq")[:2]),
        r"'freq' must be \(3,\) int64, got shape \(2,\)",
    ),
    (
        "freq float",
        _set("freq", lambda s: _get(s, "freq").double()),
        r"'freq' must be \(3,\) int64.*float64",
    ),
    (
        "negative freq",
        _set("freq", lambda s: torch.tensor([2, -3, 2])),
        r"'freq' of key 7 is -3; counts are never negative",
    ),
    (
        "last_seen after the step",
        _set("last_seen", lambda s: torch.tensor([0, 1, 12])),
        r"'last_seen' of key 9 is step 12, outside \[0, 2\]",
    ),
    (
        "negative last_seen",
        _set("last_seen", lambda s: torch.tensor([-1, 1, 1])),
        r"'last_seen' of key 5 is step -1",
    ),
    ("negative table step", _set("step", lambda s: torch.tensor(-4)), r"'step' is -4"),
    (
        "table step not int64",
        _set("step", lambda s: torch.tensor(2.0)),
        r"'step' must be \(\) int64, got shape \(\) float32",
    ),
    (
        "weight rows",
        _set("weight", lambda s: torch.zeros(4, 3)),
        r"'weight' must be \(3, 3\) floating point, got shape \(4, 3\)",
    ),
    (
        "weight int64",
        _set("weight", lambda s: torch.zeros(3, 3, dtype=torch.int64)),
        r"'weight' must be \(3, 3\) floating point.*int64",
    ),
    (
        "slot dim",
        _set("accumulators", lambda s: torch.ones(3, 2)),
        r"'accumulators' must be \(3, 3\) floating point, got shape \(3, 2\)",
    ),
    (
        "key pending and held",
        _set("pending/keys", lambda s: torch.tensor([7, 13])),
        r"'pending/keys' holds key 7, which also holds a row",
    ),
    (
        "duplicate pending key",
        _set("pending/keys", lambda s: torch.tensor([13, 13])),
        r"'pending/keys' holds key 13 twice",
    ),
    (
        "negative pending count",
        _set("pending/counts", lambda s: torch.tensor([1, -1])),
        r"'pending/counts' of key 13 is -1",
    ),
    (
        "pending last_seen after the step",
        _set("pending/last_seen", lambda s: torch.tensor([0, 3])),
        r"'pending/last_seen' of key 13 is step 3, outside \[0, 2\]",
    ),
    (
        "pending counts of 3 entries",
        _set("pending/counts", lambda s: torch.ones(3, dtype=torch.int64)),
        r"'pending/counts' must be \(2,\) int64",
    ),
    (
        "a sketch without its count",
        _set("pending/sketch", lambda s: torch.zeros(4, 1 << 20, dtype=torch.int64)),
        r"'pending/sketch' comes without 'pending/sketched'",
    ),
    (
        "a list for keys",
        _set("keys", lambda s: [5, 7, 9]),
        r"seen\.keys: expected a dense tensor holding data, got list",
    ),
]


@pytest.mark.parametrize("plan", [None, "key_hash"])
@pytest.mark.parametrize("strict", [True, False])
@pytest.mark.parametrize(("case", "edit", "message"), BROKEN, ids=[b[0] for b in BROKEN])
def test_a_broken_dynamic_table_refuses_the_whole_load(plan, strict, case, edit, message):
    state = fresh_fixed(trained_state(plan))
    edit(state)
    emb = make_engine(plan)
    before = snapshot(emb)
    with pytest.raises(RuntimeError, match=rf"table '{SEEN}': |{message}") as info:
        emb.load_state_dict(state, strict=strict)
    assert __import__("re").search(message, str(info.value)), str(info.value)
    assert_same(before, snapshot(emb))  # the fixed table and the step too


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("video.weight", torch.zeros(10, 4, dtype=torch.int32), r"video\.weight: .*floating"),
        ("video.accumulators", torch.ones(10, 4, dtype=torch.bool), r"video\.accumulators"),
        ("step", torch.tensor(-3), r"step: the step is -3, expected >= 0"),
        ("step", torch.tensor(2.5), r"step: expected an integer tensor, got torch\.float32"),
    ],
)
def test_a_fixed_table_or_step_of_the_wrong_dtype_or_sign_loads_nothing(key, value, message):
    state = fresh_fixed(trained_state())
    state[key] = value
    emb = make_engine()
    before = snapshot(emb)
    for strict in (True, False):
        with pytest.raises(RuntimeError, match=message):
            emb.load_state_dict(state, strict=strict)
        assert_same(before, snapshot(emb))


@pytest.mark.parametrize("plan", [None, "key_hash"])
def test_strict_needs_the_pending_counts(plan):
    state = fresh_fixed(trained_state(plan))
    for name in ("pending/keys", "pending/counts", "pending/last_seen"):
        partial = {k: v for k, v in state.items() if k != f"{SEEN}.{name}"}
        emb = make_engine(plan)
        before = snapshot(emb)
        with pytest.raises(RuntimeError, match=rf"Missing key\(s\).*{SEEN}\.{name}"):
            emb.load_state_dict(partial)
        assert_same(before, snapshot(emb))
        with pytest.raises(RuntimeError, match=r"seen: a dynamic table loads whole"):
            emb.load_state_dict(partial, strict=False)  # two of three: partial
        assert_same(before, snapshot(emb))


def test_non_strict_may_leave_the_pending_counts_out_as_a_group():
    state = fresh_fixed(trained_state())
    given = {k: v for k, v in state.items() if "pending/" not in k}
    emb = make_engine()
    result = emb.load_state_dict(given, strict=False)
    assert sorted(result.missing_keys) == [
        f"{SEEN}.pending/counts",
        f"{SEEN}.pending/keys",
        f"{SEEN}.pending/last_seen",
    ]
    after = emb.state_dict()
    assert after[f"{SEEN}.keys"].tolist() == [5, 7, 9]
    assert after[f"{SEEN}.pending/keys"].tolist() == []  # no counts: none pending
    assert torch.equal(after["video.weight"], state["video.weight"])


def test_pending_entries_are_unexpected_for_a_table_without_admission():
    state = fresh_fixed(trained_state())
    emb = make_engine(admission=1)
    before = snapshot(emb)
    with pytest.raises(RuntimeError, match=r"Unexpected key\(s\).*seen\.pending/keys"):
        emb.load_state_dict(state)
    assert_same(before, snapshot(emb))
    result = emb.load_state_dict(state, strict=False)
    assert sorted(k for k in result.unexpected_keys if k.startswith(SEEN)) == [
        f"{SEEN}.pending/counts",
        f"{SEEN}.pending/keys",
        f"{SEEN}.pending/last_seen",
    ]
    assert emb.table_keys(SEEN).tolist() == [5, 7, 9]


def test_a_valid_state_still_loads_whole():
    state = fresh_fixed(trained_state())
    emb = make_engine()
    emb.load_state_dict(state)
    after = emb.state_dict()
    for key, value in state.items():
        assert torch.equal(after[key], value), key


def test_a_checkpoint_holding_an_impossible_dynamic_table_is_refused(tmp_path):
    """A crafted checkpoint (its digests consistent) whose dynamic table holds a key both
    pending and held and a last-seen step after its step: refused before anything loads."""
    source = make_engine()
    state = trained_state()
    seen = {k[len(SEEN) + 1 :]: v.numpy() for k, v in state.items() if k.startswith(SEEN)}
    seen["pending/keys"] = np.array([7, 13])
    seen["last_seen"] = np.array([0, 1, 30])
    index = next(t.index for t in source.tables if t.name == SEEN)
    source.store.load_dynamic_state(index, seen)  # the store's own loader trusts its caller
    ec.checkpoint.save(source, str(tmp_path / "crafted"))
    emb = make_engine()
    emb.load_state_dict(fresh_fixed(trained_state()))
    before = snapshot(emb)
    with pytest.raises(ec.checkpoint.CheckpointError) as info:
        ec.checkpoint.load(emb, str(tmp_path / "crafted"))
    message = str(info.value)
    assert "'pending/keys' holds key 7, which also holds a row" in message
    assert "'last_seen' of key 9 is step 30" in message and "nothing was loaded" in message
    assert_same(before, snapshot(emb))


@pytest.mark.parametrize(
    "key", ["video.weight", f"{SEEN}.weight", f"{SEEN}.keys", f"{SEEN}.pending/counts", "step"]
)
@pytest.mark.parametrize("kind", ["meta", "sparse"])
def test_a_sparse_or_meta_tensor_anywhere_loads_nothing(key, kind):
    """Shapes and dtypes right, values unusable: before, the fixed table was already
    replaced when the dynamic table's copy failed."""
    state = fresh_fixed(trained_state())
    value = state[key]
    state[key] = value.to("meta") if kind == "meta" else value.to_sparse()
    emb = make_engine()
    before = snapshot(emb)
    with pytest.raises(RuntimeError, match=rf"{key}: expected a dense tensor holding data"):
        emb.load_state_dict(state, strict=False)
    assert_same(before, snapshot(emb))
