"""Conformance of the fused CPU backend (embcore.ops.cpu) with the reference backend.

Every optimizer (with its options: gradient clipping, weight decay, weight clipping, non-lazy
Adam, both FTRL forms), combiner, weights, dims 1/5/13/64, duplicate ids, empty bags, shared
tables, several tables with different optimizers in one step, and every input format through
the engine (dense, sparse, ragged, sequences). Activations, tables and slots must agree within
float32 rounding; rows no id touched must stay bit-identical. The ids change from step to
step, so rows touched before but not now meet a stale entry of the persistent dedup index
(non-lazy Adam reads it for every row).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import pytest
import torch
from optimizer_cases import OPTIMIZERS

import embcore as ec
from embcore import ops
from embcore._numba.threads import MIN_WORK_PER_THREAD
from embcore.inputs import FeatureBatch
from embcore.ops import cpu, reference
from embcore.ops.cpu import gather
from embcore.ops.state import TableState

RTOL, ATOL = 1e-5, 1e-6


@pytest.fixture(autouse=True)
def _one_thread() -> Iterator[None]:
    """Small tensors; thread hand-offs would cost more than the work on a busy machine.
    (:func:`test_thread_count_does_not_change_results` runs two threads on purpose.)"""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


# ------------------------------------------------------------------------------- helpers


def make_state(opt: ec.Optimizer | None, vocab: int, dim: int, seed: int) -> TableState:
    """A table with random rows and random (valid) slot values, so every term matters."""
    gen = torch.Generator().manual_seed(seed)
    weight = torch.randn(vocab, dim, generator=gen) * 0.5
    slots = {}
    for spec in opt.slot_specs() if opt is not None else ():
        value = torch.full(spec.shape(vocab, dim), spec.initial_value)
        value += torch.rand(value.shape, generator=gen) * 0.2  # accumulators stay >= 0
        slots[spec.name] = value
    return TableState(f"table{seed}", weight, slots, opt)


def copy_state(state: TableState) -> TableState:
    slots = {k: v.clone() for k, v in state.slots.items()}
    return TableState(state.name, state.weight.clone(), slots, state.optimizer)


def make_batch(
    gen: torch.Generator,
    vocab: int,
    samples: int,
    max_ids: int,
    combiner: str = "sum",
    weighted: bool = False,
) -> FeatureBatch:
    """Random bags of 0..max_ids ids, with duplicates (small vocab) and empty bags."""
    lengths = torch.randint(0, max_ids + 1, (samples,), generator=gen)
    offsets = torch.zeros(samples + 1, dtype=torch.int64)
    offsets[1:] = torch.cumsum(lengths, 0)
    values = torch.randint(0, vocab, (int(offsets[-1]),), generator=gen)
    weights = torch.rand(values.numel(), generator=gen) * 2 - 0.5 if weighted else None
    return FeatureBatch(values, offsets, weights, combiner, (samples,))


def touched(features: list[FeatureBatch], vocab: int) -> torch.Tensor:
    mask = torch.zeros(vocab, dtype=torch.bool)
    for f in features:
        mask[f.values] = True
    return mask


def assert_close(a: torch.Tensor, b: torch.Tensor, what: str) -> None:
    torch.testing.assert_close(a, b, rtol=RTOL, atol=ATOL, msg=lambda m: f"{what}: {m}")


def assert_states_match(
    got: TableState, want: TableState, before: TableState, untouched: torch.Tensor
) -> None:
    """cpu == reference within rounding; untouched rows bit-identical to before (lazy)."""
    assert_close(got.weight, want.weight, f"{got.name} weight")
    for name in want.slots:
        assert_close(got.slots[name], want.slots[name], f"{got.name} slot {name}")
    if got.optimizer is not None and not got.optimizer.lazy:
        return
    assert torch.equal(got.weight[untouched], before.weight[untouched])
    for name in got.slots:
        assert torch.equal(got.slots[name][untouched], before.slots[name][untouched])


def touched_in_any(steps: list[list[list[FeatureBatch]]], table: int, vocab: int) -> torch.Tensor:
    """Rows of ``table`` that any step's features touch."""
    mask = torch.zeros(vocab, dtype=torch.bool)
    for features in steps:
        mask |= touched(features[table], vocab)
    return mask


def run_both(
    states: list[TableState], steps: list[list[list[FeatureBatch]]], seed: int = 0
) -> list[TableState]:
    """Look up and update with both backends, once per entry of ``steps`` (that step's
    features of each table); compare at every step. Consecutive steps must leave out some
    rows the previous one touched, so stale dedup-index entries are met."""
    for t, state in enumerate(states):
        vocab = state.weight.shape[0]
        for before, after in itertools.pairwise(steps):
            left = touched(before[t], vocab) & ~touched(after[t], vocab)
            assert bool(left.any()), f"table {t}: the next step touches every row again"
    ours = [copy_state(s) for s in states]
    gen = torch.Generator().manual_seed(seed + 1)
    for step, features in enumerate(steps, start=1):
        got, want = cpu.lookup(ours, features), reference.lookup(states, features)
        for t, (g_acts, w_acts) in enumerate(zip(got, want, strict=True)):
            for g, w in zip(g_acts, w_acts, strict=True):
                assert_close(g, w, f"table {t} activation, step {step}")
        grads = [
            [torch.randn(f.num_samples, s.weight.shape[1], generator=gen) for f in fs]
            for s, fs in zip(states, features, strict=True)
        ]
        lrs = [0.05 * step] * len(states)
        cpu.update(ours, features, grads, lrs, step)
        reference.update(states, features, grads, lrs, step)
    return ours


# --------------------------------------------------------------------------------- tests


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_every_optimizer_matches_reference(name: str) -> None:
    opt = OPTIMIZERS[name]
    vocab, dim = 40, 13
    gen = torch.Generator().manual_seed(3)
    state = make_state(opt, vocab, dim, seed=1)
    before = copy_state(state)
    steps = [
        [[make_batch(gen, vocab, 16, 4, "mean", True), make_batch(gen, vocab, 9, 3)]]
        for _ in range(3)
    ]
    got = run_both([state], steps)[0]
    untouched = ~touched_in_any(steps, 0, vocab)
    assert_states_match(got, state, before, untouched)
    if not opt.lazy:  # every row moved, untouched ones with g = 0
        assert not torch.equal(got.weight[untouched], before.weight[untouched])


@pytest.mark.parametrize("dim", [1, 5, 13, 64])
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("combiner", ["sum", "mean", "sqrtn"])
def test_combiners_weights_and_dims(combiner: str, weighted: bool, dim: int) -> None:
    vocab = 30
    gen = torch.Generator().manual_seed(dim)
    state = make_state(ec.Adagrad(learning_rate=0.1), vocab, dim, seed=dim)
    before = copy_state(state)
    steps = [[[make_batch(gen, vocab, 20, 5, combiner, weighted)]] for _ in range(2)]
    got = run_both([state], steps)[0]
    assert_states_match(got, state, before, ~touched_in_any(steps, 0, vocab))


@pytest.mark.parametrize("combiner", ["mean", "sqrtn"])
def test_zero_denominator_and_empty_bags_give_zero(combiner: str) -> None:
    """Weights summing to zero (mean) and empty bags: activation 0, no gradient."""
    values = torch.tensor([2, 5, 5, 7])
    offsets = torch.tensor([0, 2, 2, 4])  # sample 1 is empty
    weights = torch.tensor([1.0, -1.0, 0.0, 0.0])  # sample 0 sums to 0; sample 2 all zero
    batch = FeatureBatch(values, offsets, weights, combiner, (3,))
    state = make_state(ec.SGD(learning_rate=1.0), 10, 4, seed=0)
    before = copy_state(state)
    acts = cpu.lookup([state], [[batch]])[0][0]
    if combiner == "sqrtn":
        assert torch.count_nonzero(acts[1:]) == 0
    else:
        assert torch.count_nonzero(acts) == 0
    got = run_both([state], [[[batch]]])[0]
    assert_states_match(got, state, before, ~touched([batch], 10))


@pytest.mark.parametrize("name", ["adagrad", "rowwise_adagrad", "sgd"])
def test_big_table_few_ids_matches_reference(name: str) -> None:
    """A step with few ids for its vocabulary dedups through a batch-sized hash table rather
    than the per-table index: same unique rows, same sums, two features sharing the table."""
    vocab, dim = 20_000, 8
    gen = torch.Generator().manual_seed(7)
    state = make_state(OPTIMIZERS[name], vocab, dim, seed=2)
    before = copy_state(state)

    def clustered(samples: int, combiner: str, weighted: bool) -> FeatureBatch:
        batch = make_batch(gen, 500, samples, 4, combiner, weighted)  # many duplicates
        spread = batch.values * 40 + 3  # spread over the vocabulary
        return FeatureBatch(spread, batch.offsets, batch.weights, combiner, (samples,))

    steps = [[[clustered(300, "mean", True), clustered(200, "sum", False)]] for _ in range(3)]
    got = run_both([state], steps)[0]
    assert_states_match(got, state, before, ~touched_in_any(steps, 0, vocab))


def test_shared_table_and_mixed_optimizers_in_one_step() -> None:
    """Two features on one table sum their gradients; tables with different optimizers (and
    the same optimizer with different settings) are updated in the same step."""
    gen = torch.Generator().manual_seed(7)
    specs = [
        (OPTIMIZERS["adagrad"], 50, 8),
        (OPTIMIZERS["ftrl-l1-l2-beta-power"], 20, 5),
        (OPTIMIZERS["adam-non-lazy"], 30, 3),
        (ec.Adagrad(learning_rate=0.5, initial_accumulator_value=1.0), 25, 1),
        (OPTIMIZERS["rowwise_adagrad"], 60, 64),
    ]
    states = [make_state(o, v, d, seed=i) for i, (o, v, d) in enumerate(specs)]
    befores = [copy_state(s) for s in states]
    steps = [
        [
            [make_batch(gen, v, 12, 3, "sqrtn", True), make_batch(gen, v, 7, 4, "sum")]
            for _, v, _ in specs
        ]
        for _ in range(3)
    ]
    got = run_both(states, steps)
    for t, (g, s, b, (_, v, _)) in enumerate(zip(got, states, befores, specs, strict=True)):
        assert_states_match(g, s, b, ~touched_in_any(steps, t, v))


def test_duplicate_ids_sum_gradients_before_one_update() -> None:
    """Adagrad squares the summed gradient once (docs/semantics.md §3.1), not the sum of squares."""
    state = make_state(ec.Adagrad(learning_rate=1.0, initial_accumulator_value=1.0), 4, 2, 0)
    state.weight.zero_()
    state.slots["accumulators"].fill_(1.0)
    batch = FeatureBatch(torch.tensor([3, 3, 3]), torch.tensor([0, 2, 3]), None, "sum", (2,))
    grads = [[torch.tensor([[1.0, 0.0], [1.0, 2.0]])]]
    cpu.update([state], [[batch]], grads, [1.0], 1)
    g = torch.tensor([3.0, 2.0])  # 2 * sample 0 + sample 1
    assert torch.equal(state.slots["accumulators"][3], 1.0 + g * g)
    assert_close(state.weight[3], -g / torch.sqrt(1.0 + g * g), "row 3")
    assert torch.count_nonzero(state.weight[:3]) == 0


def test_thread_count_does_not_change_results() -> None:
    """Sums run in a fixed order whatever the thread count: results are bit-identical."""
    gen = torch.Generator().manual_seed(11)
    # big enough that every kernel splits its work (threads.MIN_WORK_PER_THREAD)
    states = [make_state(OPTIMIZERS["adam"], 6000, 16, seed=i) for i in range(3)]
    features = [[make_batch(gen, 6000, 1000, 6, "mean", True)] for _ in states]
    grads = [[torch.randn(1000, 16, generator=gen)] for _ in states]
    results = []
    assert sum(int(f[0].values.unique().numel()) for f in features) >= MIN_WORK_PER_THREAD
    for threads in (1, 2):
        torch.set_num_threads(threads)
        copies = [copy_state(s) for s in states]
        acts = cpu.lookup(copies, features)
        cpu.update(copies, features, grads, [0.1] * 3, 1)
        results.append((acts, copies))
    (acts1, s1), (acts2, s2) = results
    for a, b in zip(acts1, acts2, strict=True):
        assert torch.equal(a[0], b[0])
    for a, b in zip(s1, s2, strict=True):
        assert torch.equal(a.weight, b.weight)
        assert all(torch.equal(a.slots[k], b.slots[k]) for k in a.slots)


def test_out_of_range_id_raises_and_changes_nothing() -> None:
    state = make_state(OPTIMIZERS["adagrad"], 10, 4, seed=0)
    before = copy_state(state)
    batch = FeatureBatch(torch.tensor([1, 10]), torch.tensor([0, 1, 2]), None, "sum", (2,))
    with pytest.raises(IndexError, match=r"id 10 .*'table0' with 10 rows"):
        cpu.lookup([state], [[batch]])
    with pytest.raises(IndexError, match="id 10"):
        cpu.update([state], [[batch]], [[torch.ones(2, 4)]], [0.1], 1)
    assert torch.equal(state.weight, before.weight)
    assert torch.equal(state.slots["accumulators"], before.slots["accumulators"])


@pytest.mark.parametrize("name", ["adagrad", "rowwise_adagrad"])
def test_out_of_range_id_in_a_later_table_changes_no_table(name: str) -> None:
    """The rule of a table may run right after its own dedup: every id is checked first, so
    a bad id in the last table leaves the first one unchanged too."""
    states = [make_state(OPTIMIZERS[name], 10, 4, seed=s) for s in range(2)]
    before = [copy_state(s) for s in states]
    good = FeatureBatch(torch.tensor([1, 2]), torch.tensor([0, 1, 2]), None, "sum", (2,))
    bad = FeatureBatch(torch.tensor([3, 10]), torch.tensor([0, 1, 2]), None, "sum", (2,))
    grads = [[torch.ones(2, 4)], [torch.ones(2, 4)]]
    with pytest.raises(IndexError, match=r"id 10 .*'table1' with 10 rows"):
        cpu.update(states, [[good], [bad]], grads, [0.1, 0.1], 1)
    for state, old in zip(states, before, strict=True):
        assert torch.equal(state.weight, old.weight)
        assert all(torch.equal(state.slots[k], old.slots[k]) for k in state.slots)


def test_unsupported_dtype_raises_not_implemented() -> None:
    state = TableState("wide", torch.zeros(4, 2, dtype=torch.float64), {}, None)
    batch = FeatureBatch(torch.tensor([1]), torch.tensor([0, 1]), None, "sum", (1,))
    with pytest.raises(NotImplementedError, match=r"backend 'cpu'.*table 'wide'.*float64"):
        cpu.lookup([state], [[batch]])


@pytest.mark.parametrize("layout", ["transposed", "row_strided"])
def test_non_contiguous_gradient_is_accepted(layout: str) -> None:
    state = make_state(OPTIMIZERS["sgd"], 10, 3, seed=0)
    want = copy_state(state)
    batch = FeatureBatch(torch.tensor([1, 4, 4]), torch.tensor([0, 2, 3]), None, "sum", (2,))
    grads = {
        "transposed": torch.randn(3, 2).t(),  # (2, 3), columns strided
        "row_strided": torch.randn(2, 4, 3)[:, 1],  # (2, 3), rows 12 floats apart (a stack)
    }
    grad = grads[layout]
    cpu.update([state], [[batch]], [[grad]], [0.1], 1)
    reference.update([want], [[batch]], [[grad]], [0.1], 1)
    assert_close(state.weight, want.weight, "weight")


def test_dedup_index_is_allocated_once_per_table() -> None:
    """The per-table sparse-set index is reused across steps (no per-step O(vocab) alloc)."""
    from embcore.ops.cpu.layout import positions

    state = make_state(OPTIMIZERS["adagrad"], 1000, 2, seed=0)
    batch = FeatureBatch(torch.tensor([1, 999]), torch.tensor([0, 1, 2]), None, "sum", (2,))
    cpu.update([state], [[batch]], [[torch.ones(2, 2)]], [0.1], 1)
    index = positions(state.weight)
    cpu.update([state], [[batch]], [[torch.ones(2, 2)]], [0.1], 2)
    assert positions(state.weight) is index and index.shape == (1000,)


def test_cpu_is_the_default_backend_on_cpu() -> None:
    assert ops.default_backend(torch.device("cpu")) == "cpu"
    table = ec.TableConfig(vocabulary_size=5, dim=2, name="t")
    engine = ec.EmbeddingEngine({"f": ec.FeatureConfig(table=table)}, optimizer=ec.SGD())
    assert engine.backend == "cpu"


# ------------------------------------------------------------------ through the engine


def _engine_inputs(shift: int = 0) -> tuple[dict, dict, dict]:
    """Features of every input format on two tables (one shared), plus weights; every id
    moved ``shift`` rows on (modulo the table's size), so steps can read different rows."""
    shared = ec.TableConfig(vocabulary_size=20, dim=5, combiner="sqrtn", name="shared")
    other = ec.TableConfig(
        vocabulary_size=15,
        dim=13,
        combiner="mean",
        name="other",
        optimizer=ec.FTRL(learning_rate=0.2, l1_regularization_strength=0.01),
    )
    config = {
        "dense": ec.FeatureConfig(table=shared),
        "dense_2d": ec.FeatureConfig(table=other),
        "sparse": ec.FeatureConfig(table=shared),
        "ragged": ec.FeatureConfig(table=other),
        "sparse_sequence": ec.FeatureConfig(table=shared, max_sequence_length=3),
        "ragged_sequence": ec.FeatureConfig(table=other, max_sequence_length=2),
    }

    def on_shared(ids: list) -> torch.Tensor:
        return (torch.tensor(ids) + shift) % 20

    def on_other(ids: list) -> torch.Tensor:
        return (torch.tensor(ids) + shift) % 15

    def ragged_on_other(rows: list[list[int]]) -> ec.RaggedIds:
        return ec.RaggedIds.from_lists([[(i + shift) % 15 for i in r] for r in rows])

    sparse_ids = torch.sparse_coo_tensor(
        torch.tensor([[0, 0, 2, 2, 3], [0, 1, 0, 3, 1]]),
        on_shared([4, 4, 9, 1, 19]),
        (4, 5),
        check_invariants=True,
    )
    features = {
        "dense": on_shared([1, 4, 4, 19]),
        "dense_2d": on_other([[2], [2], [11], [0]]),
        "sparse": sparse_ids,
        "ragged": ragged_on_other([[3, 3, 7], [], [14], [0, 2]]),
        "sparse_sequence": sparse_ids,
        "ragged_sequence": ragged_on_other([[5, 6, 7], [], [5], [1, 1]]),
    }
    weights = {
        "sparse": torch.sparse_coo_tensor(
            sparse_ids._indices(),
            torch.tensor([0.5, 2.0, 1.0, -1.0, 3.0]),
            (4, 5),
            check_invariants=True,
        ),
        "ragged": ec.RaggedIds.from_lists([[1.0, 0.5, 2.0], [], [0.25], [1.0, 3.0]]),
    }
    return config, features, weights


@pytest.mark.parametrize("optimizer", ["adagrad", "adam-non-lazy", "rowwise_adagrad"])
def test_engine_every_input_format_matches_reference(optimizer: str) -> None:
    config, _, _ = _engine_inputs()
    engines = {
        backend: ec.EmbeddingEngine(config, optimizer=OPTIMIZERS[optimizer], backend=backend)
        for backend in ("cpu", "reference")
    }
    for step, shift in enumerate([0, 3, 7]):  # each step reads rows the previous one did not
        _, features, weights = _engine_inputs(shift)
        acts = {}
        for backend, engine in engines.items():
            out = engine(features, weights)
            loss = sum((a * a).sum() * (i + 1) for i, a in enumerate(out.values()))
            loss.backward()
            acts[backend] = out
        for name in config:
            assert_close(acts["cpu"][name], acts["reference"][name], f"{name} at step {step}")
    got, want = engines["cpu"].state_dict(), engines["reference"].state_dict()
    assert got.keys() == want.keys()
    for key in want:
        assert_close(got[key], want[key], key)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("stream", [True, False])
@pytest.mark.parametrize("dim", [16, 40, 64])
@pytest.mark.parametrize("layout", ["contiguous", "stacked", "misaligned"])
def test_one_id_lookups_into_every_layout_copy_rows_exactly(
    dim: int, layout: str, stream: bool, threads: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Bags of one unweighted id are row copies; in a large output (``stream``: the
    threshold lowered to this one's size), where each output row is whole aligned 64-byte
    lines (dim 16, 64 into an aligned tensor, also as the strided slices of a stacked
    output) they are written with non-temporal stores, else with plain ones (dim 40, or rows
    shifted off the 64-byte grid). Either way every row equals the table's, also when two
    workers write them (each fences its streamed rows before the call returns)."""
    monkeypatch.setattr(gather, "STREAM_BYTES", 0 if stream else gather.STREAM_BYTES)
    torch.set_num_threads(threads)
    gen = torch.Generator().manual_seed(dim)
    samples, vocab = 1000, 50  # chunks of samples, repeated ids, work for two workers
    assert 3 * samples >= MIN_WORK_PER_THREAD
    states = [make_state(None, vocab, dim, seed=t) for t in range(3)]
    features = [
        [FeatureBatch(torch.randint(0, vocab, (samples,), generator=gen),
                      torch.arange(samples + 1), None, "sum", (samples,))]
        for _ in states
    ]  # fmt: skip
    if layout == "contiguous":
        outs = [[torch.empty(samples, dim)] for _ in states]
    elif layout == "stacked":
        stack = torch.empty(samples, len(states), dim)
        outs = [[stack[:, t]] for t in range(len(states))]
    else:  # one float past a 64-byte boundary: rows are not on the line grid
        flat = torch.empty(samples * dim + 16)
        shift = (-flat.data_ptr() // 4) % 16 + 1
        outs = [[flat[shift : shift + samples * dim].view(samples, dim)] for _ in states[:1]]
        outs += [[torch.empty(samples, dim)] for _ in states[1:]]
    cpu.lookup(states, features, out=outs)
    for state, batches, out in zip(states, features, outs, strict=True):
        assert torch.equal(out[0], state.weight[batches[0].values])
