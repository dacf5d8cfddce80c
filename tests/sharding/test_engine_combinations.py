"""Property-based: engines drawn across every axis that interacts (combination_cases.py, beside
this file), checked step by step against the NumPy model, through a checkpoint and a delta
round trip in the middle; with 2 gloo ranks (ranks in a drawn order), the middle is an N -> M
load: one process trains the first half and saves, the ranks load it (1 -> 2) and train the
rest, and one process loads what the ranks saved (2 -> 1).

Hypothesis is derandomized (the same cases every run) and bounded for CI. A nightly-style run
draws many more: ``EMBCORE_COMBINATIONS=nightly pytest tests/sharding/test_engine_combinations.py``
(docs/testing.md).
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Iterator

import combination_cases as cc
import pytest
import sharding_harness as h
import torch
import torch._dynamo
from engine_cases import OPTIMIZER_CASES, OptCase
from hypothesis import HealthCheck, Phase, example, given, settings
from hypothesis import strategies as st

from embcore._numba.threads import MIN_WORK_PER_THREAD
from embcore.ops.cpu import FUSE_BYTES

PROFILE = os.environ.get("EMBCORE_COMBINATIONS", "ci")
#: examples per test: (one process, 2 ranks); "nightly", or a number of one-process examples
EXAMPLES = {"ci": (14, 2), "nightly": (300, 40)}.get(PROFILE) or (
    int(PROFILE),
    int(PROFILE) // 7 + 1,
)


def _settings(examples: int, shrink: bool = True) -> settings:
    phases = list(Phase) if shrink else [Phase.explicit, Phase.reuse, Phase.generate]
    return settings(
        phases=phases,
        max_examples=examples,
        derandomize=True,
        database=None,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )


@pytest.fixture(autouse=True)
def _fresh_dynamo() -> Iterator[None]:
    torch._dynamo.reset()
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


#: ids per rank and step: below and above the threads' threshold; "unfused": above the fuse
#: threshold of FUSE_BYTES (dim 64)
SIZES = {
    "tiny": 6,
    "small": 40,
    "threaded": MIN_WORK_PER_THREAD + 60,
    "unfused": math.ceil(FUSE_BYTES / 4 / 64) + 64,
}


@st.composite
def table_specs(draw, index: int, sharded: bool, rowwise: bool) -> cc.TableSpec:
    name = "abc"[index]
    size = draw(st.sampled_from(list(SIZES)))
    dim = 64 if size == "unfused" else draw(st.sampled_from([1, 4, 13]))
    combiner = draw(st.sampled_from(["sum", "mean", "sqrtn"]))
    if draw(st.booleans()):  # dynamic: admission, each eviction rule or none
        evict = draw(st.sampled_from(["none", "ttl", "cap", "both"]))
        return cc.TableSpec(
            name, None, dim, combiner, min(SIZES[size], 300),
            min_count=draw(st.integers(1, 3)),
            ttl=draw(st.integers(1, 3)) if evict in ("ttl", "both") else None,
            cap=draw(st.integers(4, 12)) if evict in ("cap", "both") else None,
        )  # fmt: skip
    # few ids for the vocabulary (hashed dedup) or many (the table's index)
    vocab = draw(st.sampled_from([7, 300, 60_000]))
    schemes = ["row_wise:div", "row_wise:mod", "table_wise", "data_parallel"]
    if dim > 1 and not rowwise:
        schemes.append("column_wise")
    scheme = draw(st.sampled_from(schemes)) if sharded else "row_wise:div"
    return cc.TableSpec(name, vocab, dim, combiner, SIZES[size], scheme=scheme)


@st.composite
def combos(draw, sharded: bool) -> cc.Combo:
    optimizer = draw(st.sampled_from(OPTIMIZER_CASES))
    rowwise = optimizer.kind == "rowwise_adagrad"
    count = draw(st.integers(1, 3))
    tables = tuple(draw(table_specs(i, sharded, rowwise)) for i in range(count))
    big = [t for t in tables if t.ids >= SIZES["threaded"]]
    # one big table per engine keeps a case to about a second
    tables = tuple(
        t if t.ids < SIZES["threaded"] or t is big[0]
        else dataclasses.replace(t, ids=SIZES["small"], dim=min(t.dim, 13))
        for t in tables
    )  # fmt: skip
    steps = draw(st.integers(3, 5))
    ranks = tuple(draw(st.permutations([0, 1]))) if sharded else None
    return cc.Combo(
        optimizer=optimizer,
        tables=tables,
        weighted=draw(st.booleans()),
        pipeline=draw(st.booleans()),
        compiled=draw(st.booleans()),
        stats=draw(st.booleans()),
        tpu_style=tuple(draw(st.lists(st.booleans(), min_size=steps, max_size=steps))),
        ranks=ranks,
        threads=draw(st.sampled_from([1, 2])),
        seed=draw(st.integers(0, 2**16)),
    )


def _case(case_id: str) -> OptCase:
    return next(c for c in OPTIMIZER_CASES if c.id == case_id)


T = cc.TableSpec
#: corners every run checks besides the drawn cases: fused and unfused tables in one step
#: beside an evicting dynamic table (a pipeline drained before each training lookup),
#: compiled; a stale pipeline with a dynamic table that never evicts; each optimizer kind
EXPLICIT = [
    cc.Combo(
        _case("adagrad"),
        (T("a", 300, 64, "mean", SIZES["unfused"]), T("b", 7, 4, "sum", SIZES["small"]),
         T("c", None, 4, "sqrtn", SIZES["small"], min_count=2, cap=6)),
        weighted=True, pipeline=True, compiled=True, stats=True,
        tpu_style=(False, True, False, True), ranks=None, threads=2, seed=1,
    ),
    cc.Combo(
        _case("rowwise_adagrad-zero-init-eps-clip-decay"),
        (T("a", 60_000, 13, "sqrtn", SIZES["tiny"]), T("b", None, 1, "sum", SIZES["small"], ttl=1)),
        weighted=False, pipeline=True, compiled=False, stats=False,
        tpu_style=(True, True, False), ranks=None, threads=1, seed=2,
    ),
    cc.Combo(
        _case("adagrad_momentum-nesterov-beta2-exp3"),
        (T("a", 7, 4, "mean", SIZES["threaded"]), T("b", None, 4, "mean", SIZES["small"])),
        weighted=True, pipeline=True, compiled=True, stats=False,
        tpu_style=(False, False, True, False), ranks=None, threads=2, seed=3,
    ),
    cc.Combo(
        _case("adam-non-lazy-decay-wclip"),
        (T("a", 60_000, 4, "sum", SIZES["tiny"]),
         T("b", None, 4, "sqrtn", SIZES["small"], min_count=3, ttl=2, cap=5)),
        weighted=True, pipeline=False, compiled=False, stats=True,
        tpu_style=(False, True, False, True), ranks=None, threads=1, seed=4,
    ),
    cc.Combo(
        _case("ftrl-l1-l2-beta-power"),
        (T("a", 300, 13, "sqrtn", SIZES["small"]), T("b", 7, 1, "sum", SIZES["tiny"])),
        weighted=False, pipeline=True, compiled=True, stats=False,
        tpu_style=(False, True, False), ranks=None, threads=1, seed=5,
    ),
    cc.Combo(
        _case("sgd-cliplist-decay-by-lr-wclip"),
        (T("a", None, 13, "mean", SIZES["small"], min_count=2, ttl=2),),
        weighted=True, pipeline=False, compiled=True, stats=True,
        tpu_style=(True, False, False), ranks=None, threads=1, seed=6,
    ),
]  # fmt: skip


def _with_explicit_cases(test):
    for combo in EXPLICIT:
        test = example(combo=combo)(test)
    return test


@_with_explicit_cases
@_settings(EXAMPLES[0])
@given(combo=combos(sharded=False))
def test_drawn_engines_follow_the_numpy_model_through_a_checkpoint(combo: cc.Combo) -> None:
    torch._dynamo.reset()
    torch.set_num_threads(combo.threads)
    cc.run_one_process(combo)


@pytest.mark.multiprocess
@_settings(EXAMPLES[1], shrink=False)  # a launch per example: a failure is reported as drawn
@given(combo=combos(sharded=True))
def test_drawn_sharded_engines_follow_the_numpy_model_through_n_to_m_loads(combo, tmp_path_factory):
    torch._dynamo.reset()
    torch.set_num_threads(1)
    cc.run_sharded(combo, str(tmp_path_factory.mktemp("combo")), h.launch)


def test_the_draws_reach_every_axis() -> None:
    """The profile's cases (drawn, and the explicit ones) take every value of every axis."""
    seen: dict[str, set] = {}

    @_settings(EXAMPLES[0])
    @given(combo=combos(sharded=False))
    def collect(combo: cc.Combo) -> None:
        for axis, value in cc.axes(combo).items():
            seen.setdefault(axis, set()).update(value)

    collect()
    for combo in EXPLICIT:
        for axis, value in cc.axes(combo).items():
            seen.setdefault(axis, set()).update(value)
    missing = {a: set(v) - seen.get(a, set()) for a, v in cc.AXES.items()}
    assert not any(missing.values()), missing
