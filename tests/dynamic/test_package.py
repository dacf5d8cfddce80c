"""The dynamic-table parts stay out of the public namespace until the engine uses them."""

from __future__ import annotations

import embcore
import embcore.dynamic


def test_not_public_yet():
    assert "dynamic" not in embcore.__all__
    assert not {"CountAdmission", "Eviction", "KeyIndex"} & set(embcore.__all__)
    assert embcore.dynamic.__doc__ and "docs/dynamic_tables.md" in embcore.dynamic.__doc__
