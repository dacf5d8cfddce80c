"""The TensorFlow checkpoint importer on files it must refuse: real FIFOs, real symbolic
links, oversized and sparse files, ``checkpoint`` files naming places outside their
directory, crafted index entries (every field), slices that do not tile their tensor,
entries without a CRC32C, mistyped tables, dynamic targets; and a fuzz-ish loop of
truncations and byte flips over TensorFlow's own fixtures where ``CheckpointError`` is the
only exception ever raised. Valid checkpoints split over several data files load exactly.
Crafted files come from tf_bundle_writer.py (beside this file)."""

from __future__ import annotations

import os
import shutil
import threading
from pathlib import Path

import numpy as np
import pytest
import torch
from test_tf_checkpoint import CHECKPOINTS, EXPECTED, FIXTURES, make_engine, ragged
from tf_bundle_writer import Bundle, Entry, header

import embcore as ec
from embcore.compat._tf_bundle import read_checkpoint
from embcore.compat.tf_checkpoint import CheckpointError, load_tf_checkpoint

RNG = np.random.default_rng(0)


def snapshot(engine):
    return {k: v.clone() for k, v in engine.state_dict().items()}


def unchanged(engine, before) -> bool:
    return all(torch.equal(v, before[k]) for k, v in engine.state_dict().items())


def copy_fixture(layout: str, to: Path) -> Path:
    """The fixture's files copied into ``to``; returns the prefix there."""
    source = CHECKPOINTS[layout]
    to.mkdir(parents=True, exist_ok=True)
    for f in source.parent.iterdir():
        shutil.copy(f, to / f.name)
    return to / source.name


# ----------------------------------------------------------------- valid, several files
@pytest.mark.parametrize("layout", sorted(CHECKPOINTS))
def test_a_checkpoint_split_over_three_data_files_loads_exactly(tmp_path, layout):
    tensors = read_checkpoint(CHECKPOINTS[layout])
    bundle = Bundle(num_shards=3)
    for i, (name, value) in enumerate(sorted(tensors.items())):
        if value.ndim == 2 and value.shape[0] >= 3:  # partitioned, its slices in 2 files
            bundle.add_sliced(name, value, [0, 1, value.shape[0] // 2 + 1], [2, 0, 1])
        else:
            bundle.add(name, value, shard=i % 3)
    prefix = bundle.write(tmp_path / "ckpt")
    assert all((tmp_path / f"ckpt.data-0000{i}-of-00003").stat().st_size for i in range(3))
    again = read_checkpoint(prefix)
    assert again.keys() == tensors.keys()
    for name, value in tensors.items():
        np.testing.assert_array_equal(again[name], value, err_msg=name)
        assert again[name].dtype == value.dtype
    engine = make_engine()
    load_tf_checkpoint(engine, prefix, layout=layout)
    acts = engine({k: ragged(ids) for k, ids in EXPECTED["ids"].items()})
    for key, expected in EXPECTED["lookups"][layout].items():
        np.testing.assert_allclose(acts[key].detach().numpy(), expected, rtol=1e-6, atol=1e-7)


# -------------------------------------------------------- FIFOs, links, oversized files
def finishes(call, fifo: Path, seconds: float = 20.0) -> BaseException | None:
    """Run ``call`` in a thread; if it still runs after ``seconds`` (blocked on ``fifo``),
    open the FIFO's other end to release it and fail. Returns what it raised."""
    raised: list[BaseException | None] = [None]

    def run():
        try:
            call()
        except BaseException as e:  # handed to the test
            raised[0] = e

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
        os.close(fd)
        thread.join(5)
        pytest.fail(f"reading {fifo} hung")
    return raised[0]


@pytest.mark.parametrize("which", ["checkpoint", "index", "data"])
def test_a_fifo_is_refused_at_once(tmp_path, which):
    prefix = copy_fixture("estimator", tmp_path / "ckpt")
    target = {
        "checkpoint": prefix.parent / "checkpoint",
        "index": prefix.with_name(prefix.name + ".index"),
        "data": prefix.with_name(prefix.name + ".data-00000-of-00001"),
    }[which]
    target.unlink()
    os.mkfifo(target)
    engine = make_engine()
    before = snapshot(engine)
    error = finishes(lambda: load_tf_checkpoint(engine, prefix.parent), target)
    assert isinstance(error, CheckpointError), error
    assert str(target) in str(error) and "not a regular file" in str(error)
    assert unchanged(engine, before)


@pytest.mark.parametrize("which", ["checkpoint", ".index", ".data-00000-of-00001"])
def test_a_link_to_dev_zero_or_outside_is_never_followed(tmp_path, which):
    prefix = copy_fixture("estimator", tmp_path / "ckpt")
    outside = copy_fixture("estimator", tmp_path / "outside")  # a valid checkpoint elsewhere
    if which == "checkpoint":
        target, theirs = prefix.parent / which, outside.parent / which
    else:
        target, theirs = (
            prefix.with_name(prefix.name + which),
            outside.with_name(prefix.name + which),
        )
    for source in ("/dev/zero", theirs):
        target.unlink()
        target.symlink_to(source)
        engine = make_engine()
        before = snapshot(engine)
        with pytest.raises(CheckpointError, match=rf"{target.name}: refusing .* symbolic link"):
            load_tf_checkpoint(engine, prefix.parent)
        assert unchanged(engine, before)


def test_oversized_checkpoint_and_index_files_are_refused_before_reading(tmp_path):
    prefix = copy_fixture("midlevel", tmp_path / "ckpt")
    (prefix.parent / "checkpoint").write_text('model_checkpoint_path: "ckpt"\n')
    with open(prefix.parent / "checkpoint", "r+b") as f:  # sparse: no disk used
        f.truncate(2 << 20)
    with pytest.raises(CheckpointError, match=r"checkpoint: refusing .* more than 1048576"):
        load_tf_checkpoint(make_engine(), prefix.parent)
    with open(prefix.with_name("ckpt.index"), "r+b") as f:
        f.truncate(300 << 20)
    with pytest.raises(CheckpointError, match=r"ckpt\.index: refusing .* more than 268435456"):
        load_tf_checkpoint(make_engine(), prefix)


# ------------------------------------------------------------- model_checkpoint_path
@pytest.mark.parametrize(
    "named",
    ["../outside/model.ckpt-7", "OUTSIDE/model.ckpt-7", "sub/../../outside/model.ckpt-7", ""],
)
def test_model_checkpoint_path_outside_the_directory_is_refused(tmp_path, named):
    here = copy_fixture("estimator", tmp_path / "here").parent
    outside = copy_fixture("estimator", tmp_path / "outside").parent
    named = named.replace("OUTSIDE", str(outside))
    (here / "checkpoint").write_text(f'model_checkpoint_path: "{named}"\n')
    with pytest.raises(CheckpointError, match=r"model_checkpoint_path .* is not inside"):
        load_tf_checkpoint(make_engine(), here)


def test_model_checkpoint_path_through_a_link_outside_is_refused(tmp_path):
    here = copy_fixture("estimator", tmp_path / "here").parent
    outside = copy_fixture("estimator", tmp_path / "outside").parent
    (here / "sub").symlink_to(outside)
    (here / "checkpoint").write_text('model_checkpoint_path: "sub/model.ckpt-7"\n')
    with pytest.raises(CheckpointError, match=r"is not inside"):
        load_tf_checkpoint(make_engine(), here)


def test_model_checkpoint_path_inside_the_directory_loads(tmp_path):
    here = copy_fixture("estimator", tmp_path / "here").parent
    for named in (f"{here}/model.ckpt-7", "./model.ckpt-7", "sub/../model.ckpt-7"):
        (here / "sub").mkdir(exist_ok=True)
        (here / "checkpoint").write_text(f'model_checkpoint_path: "{named}"\n')
        assert len(load_tf_checkpoint(make_engine(), here)) == 8


# ------------------------------------------------------------------ crafted entries
def small_bundle() -> tuple[Bundle, np.ndarray]:
    value = RNG.normal(size=(6, 3)).astype(np.float32)
    bundle = Bundle(num_shards=2)
    bundle.add("input_layer/a_embedding/embedding_weights", value, shard=1)
    return bundle, value


NAME = "input_layer/a_embedding/embedding_weights"


def crafted(tmp_path: Path, edit) -> Path:
    bundle, _ = small_bundle()
    extra = edit(bundle)
    return bundle.write(tmp_path / "ckpt", **(extra or {}))


def _entry(change):
    def edit(bundle):
        change(bundle.entries[NAME.encode()])

    return edit


def _sliced(rows, shards, change=None):
    def edit(bundle):
        value = RNG.normal(size=(6, 3)).astype(np.float32)
        bundle.add_sliced(NAME, value, rows, shards)
        if change is not None:
            change(bundle)

    return edit


def _set(**fields):
    return _entry(lambda e: [setattr(e, k, v) for k, v in fields.items()])


def _drop_slice(bundle):
    bundle.entries[NAME.encode()].slices.pop()


def _overlap(bundle):
    e = bundle.entries[NAME.encode()]
    e.slices[1] = [(1, 3), (0, -1)]  # rows 1..3 overlap rows 0..2 (its key is missing too)


def _slice_of_other_dtype(bundle):
    key = next(k for k in bundle.entries if k.startswith(b"\x00"))
    bundle.entries[key].dtype = 9


CRAFTED = [
    ("data file 5 of 2", _set(shard_id=5), r"in data file 5, the checkpoint has 2"),
    ("offset past the end", _set(offset=10_000), r"runs past the end of its data file"),
    ("size of another shape", _set(size=48), r"stores 48 bytes, its shape \[6, 3\].*needs 72"),
    ("shape of another size", _set(shape=(6, 4)), r"stores 72 bytes.*\[6, 4\].*needs 96"),
    ("string dtype", _set(dtype=7), r"has dtype string, not a number type"),
    ("bool dtype", _set(dtype=10), r"has dtype bool, not a number type"),
    ("unknown dtype", _set(dtype=99), r"has dtype dtype enum 99"),
    ("no dtype", _set(dtype=None), r"has dtype dtype enum 0"),
    ("negative dim", _set(shape=(-6, 3)), r"a dim of size -6"),
    ("huge dims", _set(shape=(1 << 40, 1 << 40)), r"stores 72 bytes.*needs"),
    ("no crc", _set(crc32c=None), r"has no CRC32C \(TensorFlow refuses such an entry too\)"),
    ("wrong crc", _set(crc32c=12345), r"fails its CRC32C check"),
    ("slices in 2 files", _sliced([0, 2, 4], [1, 0, 1]), "loads"),
    ("a slice left out", _sliced([0, 2, 4], [1, 0, 1], _drop_slice), r"hold 12 of its 18"),
    ("overlapping slices", _sliced([0, 3], [0, 1], _overlap), r"slice .* is missing|overlap"),
    ("slice dtype", _sliced([0, 3], [0, 1], _slice_of_other_dtype), r"holds int64.*float32"),
    (
        "slice outside",
        _sliced([0, 3], [0, 1], lambda b: b.entries[NAME.encode()].slices.append([(5, 4)])),
        r"lies outside",
    ),
    ("no header", lambda b: {"with_header": False}, r"ckpt\.index: no header entry"),
    ("big-endian", lambda b: {"header_bytes": header(2, endianness=1)}, r"big-endian"),
    ("no data files", lambda b: {"header_bytes": header(0)}, r"the header names 0 files"),
    ("compressed block", lambda b: {"block_type": 1}, r"compressed table blocks"),
]


@pytest.mark.parametrize(("case", "edit", "message"), CRAFTED, ids=[c[0] for c in CRAFTED])
def test_a_crafted_entry_is_refused_naming_file_and_tensor(tmp_path, case, edit, message):
    prefix = crafted(tmp_path, edit)
    if message == "loads":
        assert read_checkpoint(prefix)[NAME].shape == (6, 3)
        return
    with pytest.raises(CheckpointError, match=message) as info:
        read_checkpoint(prefix, [NAME])
    assert str(tmp_path) in str(info.value)
    engine = one_table_engine()
    before = snapshot(engine)
    with pytest.raises(CheckpointError, match=str(tmp_path)):  # refused early or as above
        load_tf_checkpoint(engine, prefix, layout="estimator")
    assert unchanged(engine, before)


def test_keys_out_of_order_or_repeated_are_refused(tmp_path):
    from tf_bundle_writer import table

    items = {b"": header(1), b"b": Entry().encode(), b"a": Entry().encode()}
    (tmp_path / "x.index").write_bytes(table(items))
    with pytest.raises(CheckpointError, match=r"x\.index: the table's keys are out of order"):
        read_checkpoint(tmp_path / "x")
    pairs = [(b"", header(1)), (b"a", Entry().encode()), (b"a", Entry().encode())]
    (tmp_path / "x.index").write_bytes(table(pairs, block_entries=1))  # one block each
    with pytest.raises(CheckpointError, match=r"x\.index: the table's keys are out of order"):
        read_checkpoint(tmp_path / "x")


def one_table_engine(dtype_table: str = "tbl_a", dynamic: bool = False) -> ec.EmbeddingEngine:
    table = ec.TableConfig(vocabulary_size=None if dynamic else 6, dim=3, name=dtype_table)
    return ec.EmbeddingEngine({"a": ec.FeatureConfig(table=table, name="a")})


@pytest.mark.parametrize("dtype", [np.int64, np.int32, np.float64, np.float16])
def test_a_table_of_another_dtype_is_refused_not_cast(tmp_path, dtype):
    bundle = Bundle()
    bundle.add(NAME, (RNG.normal(size=(6, 3)) * 10).astype(dtype))
    prefix = bundle.write(tmp_path / "ckpt")
    engine = one_table_engine()
    before = snapshot(engine)
    name = np.dtype(dtype).name
    with pytest.raises(CheckpointError, match=rf"'{NAME}' is {name}, the engine holds float32"):
        load_tf_checkpoint(engine, prefix)
    assert unchanged(engine, before)


def test_a_dynamic_table_is_refused_with_what_to_do(tmp_path):
    table = ec.TableConfig(vocabulary_size=None, dim=3, name="tbl_a")
    engine = ec.EmbeddingEngine({"a": ec.FeatureConfig(table=table, name="a")}, ec.SGD(0.1))
    engine({"a": torch.tensor([4, 1])})["a"].sum().backward()
    before = snapshot(engine)
    with pytest.raises(CheckpointError, match=r"tables \['tbl_a'\] are dynamic.*load_state_dict"):
        load_tf_checkpoint(engine, CHECKPOINTS["estimator"], slots=False)
    assert unchanged(engine, before) and engine.table_keys("tbl_a").tolist() == [1, 4]


# ------------------------------------------------------------------------------ fuzz
def _damaged_loads(prefix: Path, engine) -> None:
    """Load the damaged checkpoint: success or CheckpointError, nothing else."""
    try:
        load_tf_checkpoint(engine, prefix)
    except CheckpointError as e:
        assert str(prefix.parent) in str(e)


@pytest.mark.slow
@pytest.mark.parametrize("layout", sorted(CHECKPOINTS))
def test_truncations_and_byte_flips_raise_only_checkpoint_error(tmp_path, layout):
    """Every truncation of the index (1,406 and 638 bytes), 64 of each data file, and 300
    seeded byte flips (1 to 3 bytes) of each file: 3,372 damaged checkpoints over the two
    layouts, each loaded in full (about 15 s on a busy 2-core machine)."""
    prefix = copy_fixture(layout, tmp_path / "ckpt")
    files = sorted(p for p in prefix.parent.iterdir() if p.name != "checkpoint")
    pristine = {p: p.read_bytes() for p in files}
    rng = np.random.default_rng(1)
    engine = make_engine()
    tried = 0
    for path, raw in pristine.items():
        lengths = range(len(raw)) if path.suffix == ".index" else rng.integers(0, len(raw), 64)
        for n in lengths:
            path.write_bytes(raw[: int(n)])
            _damaged_loads(prefix, engine)
            tried += 1
        for _ in range(300):
            damaged = bytearray(raw)
            for at in rng.integers(0, len(raw), rng.integers(1, 4)):
                damaged[at] ^= int(rng.integers(1, 256))
            path.write_bytes(bytes(damaged))
            _damaged_loads(prefix, engine)
            tried += 1
        path.write_bytes(raw)
    assert tried == sum(len(r) + 300 if p.suffix == ".index" else 364 for p, r in pristine.items())
    load_tf_checkpoint(engine, prefix)  # the restored files load


def test_fixtures_directory_is_untouched():
    assert (FIXTURES / "estimator" / "checkpoint").read_text().startswith("model_checkpoint_path")


def test_a_checkpoint_file_naming_two_prefixes_or_a_path_of_another_type_is_refused(tmp_path):
    here = copy_fixture("estimator", tmp_path / "here").parent
    (here / "checkpoint").write_text(
        'model_checkpoint_path: "model.ckpt-7"\nmodel_checkpoint_path: "../elsewhere/x"\n'
    )  # TensorFlow's text-format parser would take the last one
    with pytest.raises(CheckpointError, match=r"expected one model_checkpoint_path line, found 2"):
        load_tf_checkpoint(make_engine(), here)
    for path in (None, 3, b"/tmp"):
        with pytest.raises(TypeError, match=r"path must be a str or os\.PathLike"):
            load_tf_checkpoint(make_engine(), path)
