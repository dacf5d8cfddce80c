"""embcore's shared Numba toolbox, used by the CPU backend (``embcore.ops.cpu``), dynamic tables,
checkpoints, feature columns and the TensorFlow compatibility layer.

* :mod:`.cache`: the on-disk kernel cache, keyed by the kernels' sources;
* :mod:`.address`: array views from raw addresses, ``prefetch``, the atomic work counter;
* :mod:`.threads`: runs a kernel on the calling thread plus a small pool;
* :mod:`.mix`: ``mix64``, SplitMix64's finalizer; :mod:`.digests`: keyed-record digests;
* :mod:`.crc32c`: CRC-32C (TensorFlow's checksums); :mod:`.farmhash`: FarmHash
  ``Fingerprint64`` (TensorFlow's string hash);
* :mod:`.ids`: one-id inputs of many features copied into one block, range-checked on the way
  (the engine's conversion of a DLRM's categorical fields).

Its kernels are first imported here, inside the cache directory keyed by this package's
sources (:func:`.cache.kernel_cache_dir`).
"""

from __future__ import annotations

from embcore._numba.cache import kernel_cache_dir, kernels_cached_in

with kernels_cached_in(kernel_cache_dir()):
    from embcore._numba import address, crc32c, digests, farmhash, ids, mix  # noqa: F401
