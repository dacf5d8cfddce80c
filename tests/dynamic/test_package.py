"""The dynamic tables' configs are public; the index and key space stay internal."""

from __future__ import annotations

import embcore
import embcore.dynamic
from embcore.dynamic.policy import CountAdmission, Eviction


def test_configs_public_internals_not():
    assert embcore.CountAdmission is CountAdmission
    assert embcore.Eviction is Eviction
    assert {"CountAdmission", "Eviction"} <= set(embcore.__all__)
    assert not {"dynamic", "KeyIndex", "KeySpace"} & set(embcore.__all__)
    assert embcore.dynamic.__doc__ and "docs/dynamic_tables.md" in embcore.dynamic.__doc__
