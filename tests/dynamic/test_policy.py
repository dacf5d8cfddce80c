"""Admission/eviction configs (frozen, validated) and the eviction order against a sort."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from embcore.dynamic.policy import CountAdmission, Eviction, expired, least_used


def test_defaults_admit_on_first_sight_and_never_evict():
    assert CountAdmission().min_count == 1
    assert Eviction() == Eviction(steps_to_live=None, max_rows=None)
    assert not expired(np.array([0, 5], np.int64), 10**9, None).any()


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (
            lambda: CountAdmission(min_count=0),
            "CountAdmission: min_count must be an int >= 1, got 0",
        ),
        (lambda: CountAdmission(min_count=2.0), r"min_count must be an int >= 1, got 2\.0"),
        (lambda: CountAdmission(min_count=True), "min_count must be an int >= 1, got True"),
        (lambda: Eviction(steps_to_live=0), "Eviction: steps_to_live must be an int >= 1, got 0"),
        (lambda: Eviction(max_rows=-5), "Eviction: max_rows must be an int >= 1, got -5"),
        (lambda: Eviction(max_rows="10"), "max_rows must be an int >= 1, got '10'"),
    ],
)
def test_bad_values_raise_naming_the_field_and_value(make, message):
    with pytest.raises(ValueError, match=message):
        make()


def test_configs_are_frozen_and_count_admission_takes_its_count_positionally():
    config = Eviction(steps_to_live=3)
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.max_rows = 4  # type: ignore[misc]
    with pytest.raises(TypeError):
        Eviction(3)  # type: ignore[misc]  # two limits: say which
    assert CountAdmission(2) == CountAdmission(min_count=2)  # as Adagrad(0.1)
    with pytest.raises(ValueError, match="min_count must be an int >= 1, got 0"):
        CountAdmission(0)
    assert CountAdmission(min_count=np.int64(3)).min_count == 3


def test_expiry_boundary_is_t_plus_steps_to_live():
    last = np.array([0, 1, 2, 3], np.int64)
    assert expired(last, 3, 2).tolist() == [True, True, False, False]
    assert expired(last, 4, 1).tolist() == [True, True, True, True]


@pytest.mark.parametrize("seed", range(20))
def test_least_used_matches_sorting_by_freq_last_key(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 60))
    keys = rng.choice(np.arange(-100, 100), n, replace=False).astype(np.int64)
    freq = rng.integers(1, 4, n).astype(np.int64)  # many ties
    last = rng.integers(0, 3, n).astype(np.int64)
    count = int(rng.integers(0, n + 2))
    expected = sorted(range(n), key=lambda i: (freq[i], last[i], keys[i]))[:count]
    assert least_used(keys, freq, last, count).tolist() == expected
