"""The optimizer cases every kernel backend is checked with against the reference backend.

They are the engine conformance list (``engine_cases.OPTIMIZER_CASES``, one line per optimizer
and option), so adding a case there adds it to the kernel tests too.
"""

from __future__ import annotations

from engine_cases import OPTIMIZER_CASES

import embcore as ec

#: every optimizer, with its options, by case id
OPTIMIZERS: dict[str, ec.Optimizer] = {case.id: case.make() for case in OPTIMIZER_CASES}
