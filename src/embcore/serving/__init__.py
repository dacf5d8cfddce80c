"""Serving: trained models as programs that run with PyTorch alone.

:class:`ServingLookup` looks an engine's tables up with plain PyTorch operations;
:func:`serving_module` puts it in place of every engine of a model; :func:`export` traces the
result with ``torch.export`` for any batch size; :func:`save_program` and
:func:`compile_package` write it to disk. See docs/serving.md.
"""

from embcore.serving.lookup import ServingLookup
from embcore.serving.program import (
    compile_package,
    export,
    lookup_dynamic_shapes,
    save_program,
    serving_module,
)

__all__ = [
    "ServingLookup",
    "compile_package",
    "export",
    "lookup_dynamic_shapes",
    "save_program",
    "serving_module",
]
