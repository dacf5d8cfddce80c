"""The public surface is pinned: adding or removing a name is a deliberate change."""

from __future__ import annotations

import subprocess
import sys

import embcore


def test_public_names():
    assert sorted(embcore.__all__) == sorted(
        [
            "FTRL",
            "SGD",
            "Adagrad",
            "AdagradMomentum",
            "Adam",
            "CountAdmission",
            "DiskStorage",
            "EmbeddingEngine",
            "Eviction",
            "FeatureBatch",
            "FeatureConfig",
            "Optimizer",
            "Prefetcher",
            "PreparedBatch",
            "RaggedIds",
            "RowwiseAdagrad",
            "SlotSpec",
            "TableConfig",
            "__version__",
        ]
    )
    for name in embcore.__all__:
        assert hasattr(embcore, name), name


def test_compat_public_names():
    import embcore.compat

    assert sorted(embcore.compat.__all__) == ["load_tf_checkpoint", "tf", "tpu"]
    for name in embcore.compat.__all__:
        assert hasattr(embcore.compat, name), name


def test_console_script_runs():
    out = subprocess.run(
        [sys.executable, "-m", "embcore.cli.main", "--version"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.strip() == f"embcore {embcore.__version__}"
