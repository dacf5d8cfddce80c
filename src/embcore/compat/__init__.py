"""Compatibility with TensorFlow's TPU embedding API.

* :mod:`embcore.compat.tpu`: the TensorFlow class and function names on embcore.
* :mod:`embcore.compat.tf`: the same under TensorFlow's module paths, for
  ``from embcore.compat import tf`` in place of ``import tensorflow as tf``.
* :func:`load_tf_checkpoint`: tables and optimizer slots from a TensorFlow checkpoint.
"""

from embcore.compat import tf, tpu
from embcore.compat.tf_checkpoint import load_tf_checkpoint

__all__ = ["load_tf_checkpoint", "tf", "tpu"]
